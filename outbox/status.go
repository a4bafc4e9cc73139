package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// MaxSnapshotLosses bounds the losses a FeedSnapshot carries: the most
// recent ones. A feed whose source keeps vanishing could record losses
// without end; a status answer stays bounded in bytes. LossCount counts
// them all.
const MaxSnapshotLosses = 100

// FeedSnapshot is everything the store holds about one feed, read in one
// read transaction: its counters, positions, losses and backlog all come
// from the same commit, so they agree with each other.
type FeedSnapshot struct {
	FeedStats
	// Positions are the stored checkpoints, by partition.
	Positions []Checkpoint
	// Losses are the feed's most recent losses (at most MaxSnapshotLosses),
	// oldest first, acked ones included; LossCount counts every loss.
	Losses    []Loss
	LossCount int64
	// Published is the last outbox id known published: the larger of the
	// relay progress stored and the one the caller knows.
	Published int64
	// Backlog counts the feed's outbox rows after Published.
	Backlog Backlog
}

// OutboxSnapshot is the outbox as one read transaction sees it.
type OutboxSnapshot struct {
	// Published is the last outbox id known published, as in FeedSnapshot.
	Published int64
	// LastID is the last outbox id ever assigned.
	LastID int64
	// Backlog counts every row after Published.
	Backlog Backlog
}

// readTx runs f in a read transaction of the read-only pool: every read
// in f sees the same commit, and none waits for the writer.
func (s *Store) readTx(ctx context.Context, f func(tx *sqlx.Tx) error) error {
	opts := &sql.TxOptions{ReadOnly: true}
	if s.pg {
		// READ COMMITTED takes a snapshot per statement: one for the
		// whole transaction, as SQLite's read transaction has.
		opts.Isolation = sql.LevelRepeatableRead
	}
	tx, err := s.rdb.BeginTxx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer tx.Rollback()
	return f(tx)
}

// PublishedThrough returns the last outbox id a relay recorded as published
// (0 if none).
func (s *Store) PublishedThrough(ctx context.Context) (int64, error) {
	return publishedThrough(ctx, s.rdb)
}

func publishedThrough(ctx context.Context, q sqlx.QueryerContext) (int64, error) {
	var id int64
	if err := sqlx.GetContext(ctx, q, &id, `SELECT coalesce(max(last_id), 0) FROM relay_progress`); err != nil {
		return 0, fmt.Errorf("read relay progress: %w", err)
	}
	return id, nil
}

// FeedStatus returns what is stored about feed name, from one snapshot;
// only its backlog may be an earlier snapshot's, when the last count of
// the feed's pending rows was slow enough to be reused (see Backlog).
// published is the last outbox id the caller knows published (the relay's
// own view, which may be ahead of the stored one); the backlog counts the
// rows after the larger of the two. It returns an error wrapping
// ErrNotFound for a feed never registered.
func (s *Store) FeedStatus(ctx context.Context, name string, published int64) (FeedSnapshot, error) {
	var snap FeedSnapshot
	err := s.readTx(ctx, func(tx *sqlx.Tx) error {
		var err error
		snap, err = s.feedSnapshot(ctx, tx, name, published)
		return err
	})
	return snap, err
}

// FeedStatuses returns FeedStatus of every registered feed, by name, all
// from one snapshot.
func (s *Store) FeedStatuses(ctx context.Context, published int64) ([]FeedSnapshot, error) {
	var snaps []FeedSnapshot
	err := s.readTx(ctx, func(tx *sqlx.Tx) error {
		var names []string
		if err := tx.SelectContext(ctx, &names, `SELECT name FROM feeds ORDER BY name`); err != nil {
			return fmt.Errorf("read feeds: %w", err)
		}
		for _, name := range names {
			snap, err := s.feedSnapshot(ctx, tx, name, published)
			if err != nil {
				return err
			}
			snaps = append(snaps, snap)
		}
		return nil
	})
	return snaps, err
}

// OutboxStatus returns the outbox's backlog after the larger of published
// and the stored relay progress, and its last id, from one snapshot.
func (s *Store) OutboxStatus(ctx context.Context, published int64) (OutboxSnapshot, error) {
	var snap OutboxSnapshot
	err := s.readTx(ctx, func(tx *sqlx.Tx) error {
		stored, err := publishedThrough(ctx, tx)
		if err != nil {
			return err
		}
		snap.Published = max(stored, published)
		if snap.LastID, err = lastOutboxID(ctx, tx); err != nil {
			return err
		}
		snap.Backlog, err = s.backlog(ctx, tx, "", snap.Published)
		return err
	})
	return snap, err
}

func (s *Store) feedSnapshot(ctx context.Context, tx *sqlx.Tx, name string, published int64) (FeedSnapshot, error) {
	var snap FeedSnapshot
	err := tx.GetContext(ctx, &snap.FeedStats, `SELECT * FROM feeds WHERE name = ?`, name)
	if errors.Is(err, sql.ErrNoRows) {
		return snap, fmt.Errorf("feed %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return snap, fmt.Errorf("read feed %s: %w", name, err)
	}
	if err := tx.SelectContext(ctx, &snap.Positions, `SELECT partition, epoch, position, source_end, updated_at
FROM positions WHERE feed = ? ORDER BY partition`, name); err != nil {
		return snap, fmt.Errorf("read positions of %s: %w", name, err)
	}
	if err := s.snapshotLosses(ctx, tx, &snap); err != nil {
		return snap, err
	}
	stored, err := publishedThrough(ctx, tx)
	if err != nil {
		return snap, err
	}
	snap.Published = max(stored, published)
	snap.Backlog, err = s.backlog(ctx, tx, name, snap.Published)
	return snap, err
}

// lastLossesSQL reads a feed's last losses, oldest first.
const lastLossesSQL = `SELECT * FROM
(SELECT * FROM losses WHERE feed = ? ORDER BY id DESC LIMIT ?) ORDER BY id`

func (s *Store) snapshotLosses(ctx context.Context, tx *sqlx.Tx, snap *FeedSnapshot) error {
	name := snap.Name
	if err := tx.GetContext(ctx, &snap.LossCount, `SELECT count(*) FROM losses WHERE feed = ?`, name); err != nil {
		return fmt.Errorf("count losses of %s: %w", name, err)
	}
	if err := tx.SelectContext(ctx, &snap.Losses, lastLossesSQL, name, MaxSnapshotLosses); err != nil {
		return fmt.Errorf("read losses of %s: %w", name, err)
	}
	return nil
}
