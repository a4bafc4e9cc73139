package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ProcessorID names the processor that made a feed's state: its Kind (a
// built-in or registered processor's name, or "sql") and a Fingerprint of
// the configuration that gives the state its meaning ("" when none does).
// Two processors with the same ID read each other's state alike.
type ProcessorID struct {
	Kind        string `db:"kind"`
	Fingerprint string `db:"fingerprint"`
}

// String is "KIND" or "KIND (fingerprint F)".
func (p ProcessorID) String() string {
	if p.Fingerprint == "" {
		return p.Kind
	}
	return p.Kind + " (fingerprint " + p.Fingerprint + ")"
}

// How a feed's processor came to be recorded (RecordProcessor).
const (
	// ProcessorNew: the feed's first start, or a feed without state.
	ProcessorNew = "new"
	// ProcessorAdopted: a feed of a database from before processors were
	// recorded, taken to have been run by the processor it starts with.
	ProcessorAdopted = "adopted"
	// ProcessorRestart: an operator started the feed over from the
	// beginning of its source with another processor.
	ProcessorRestart = "restart"
	// ProcessorKeep: an operator gave the feed's state to another
	// processor on purpose.
	ProcessorKeep = "keep"
)

// FeedProcessor is what the database knows of a feed's processor.
type FeedProcessor struct {
	// Known: the feed has a row (it started before, or a dead letter or a
	// loss names it).
	Known bool
	// Name is the processor's name the feed last started with ("" when
	// none was stored).
	Name string
	// Recorded: ID is the recorded processor (see RecordProcessor); a feed
	// of a database from before that has none.
	Recorded bool
	ID       ProcessorID
	// HasState: the feed applied items (it has a stored position or
	// applied count): another processor would find that state.
	HasState bool
}

// FeedProcessor reads what the database knows of feed's processor.
func (s *Store) FeedProcessor(ctx context.Context, feed string) (FeedProcessor, error) {
	var fp FeedProcessor
	var row struct {
		Processor string `db:"processor"`
		Applied   int64  `db:"applied"`
		Positions int64  `db:"positions"`
	}
	err := s.db.GetContext(ctx, &row, `SELECT processor, applied,
       (SELECT count(*) FROM positions WHERE feed = feeds.name) AS positions
FROM feeds WHERE name = ?`, feed)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fp, nil
	case err != nil:
		return fp, fmt.Errorf("read the processor of feed %s: %w", feed, err)
	}
	fp.Known, fp.Name, fp.HasState = true, row.Processor, row.Applied > 0 || row.Positions > 0
	err = s.db.GetContext(ctx, &fp.ID, `SELECT kind, fingerprint FROM feed_processors WHERE feed = ?`, feed)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fp, nil
	case err != nil:
		return fp, fmt.Errorf("read the processor of feed %s: %w", feed, err)
	}
	fp.Recorded = true
	return fp, nil
}

// RecordProcessor records id as the processor of feed f (creating its
// row if new), how one of the Processor* constants. With ProcessorRestart
// it also forgets the feed's positions in the same transaction, so the
// feed reads its source again from the beginning; its counters, dead
// letters and losses stay as history.
func (s *Store) RecordProcessor(ctx context.Context, f FeedInfo, id ProcessorID, how string) error {
	err := s.recordProcessor(ctx, f, id, how)
	s.noteWrite(err)
	if err != nil {
		return fmt.Errorf("record the processor of feed %s: %w", f.Name, err)
	}
	return nil
}

func (s *Store) recordProcessor(ctx context.Context, f FeedInfo, id ProcessorID, how string) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO feeds (name, kind, source, processor) VALUES (?, ?, ?, ?)
ON CONFLICT(name) DO UPDATE SET kind = excluded.kind, source = excluded.source, processor = excluded.processor`,
		f.Name, f.Kind, f.Source, f.Processor); err != nil {
		return err
	}
	if how == ProcessorRestart {
		if _, err := tx.ExecContext(ctx, `DELETE FROM positions WHERE feed = ?`, f.Name); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO feed_processors (feed, kind, fingerprint, how, at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT(feed) DO UPDATE SET kind = excluded.kind, fingerprint = excluded.fingerprint, how = excluded.how, at = excluded.at`,
		f.Name, id.Kind, id.Fingerprint, how, s.Now().UnixNano()); err != nil {
		return err
	}
	return tx.Commit()
}
