package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// FeedInfo describes a feed; it is stored when the feed starts.
type FeedInfo struct {
	Name      string `db:"name"`
	Kind      string `db:"kind"`
	Source    string `db:"source"`
	Processor string `db:"processor"`
}

// Checkpoint is where a feed's partition stands: the epoch of its source and
// the position after the last item applied, and the source's end as last seen.
type Checkpoint struct {
	Partition int32  `db:"partition"`
	Epoch     string `db:"epoch"`
	Position  int64  `db:"position"`
	End       int64  `db:"source_end"`
	UpdatedAt int64  `db:"updated_at"`
}

// FeedStats is a feed's stored description and counters.
type FeedStats struct {
	FeedInfo
	Applied            int64  `db:"applied"`
	ReplaysSkipped     int64  `db:"replays_skipped"`
	Retries            int64  `db:"retries"`
	DeadLettered       int64  `db:"dead_lettered"`
	CompletionFailures int64  `db:"completion_failures"`
	EpochChanges       int64  `db:"epoch_changes"`
	Lossless           bool   `db:"lossless"`
	LastAppliedAt      int64  `db:"last_applied_at"` // unix nanoseconds, 0 = never
	LastError          string `db:"last_error"`
}

// StatsDelta is what a batch adds to a feed's counters.
type StatsDelta struct {
	Applied, ReplaysSkipped, Retries, DeadLettered, CompletionFailures, EpochChanges int64
	// LastAppliedAt, when not zero, replaces the stored time.
	LastAppliedAt time.Time
}

// Zero reports whether the delta changes nothing.
func (d StatsDelta) Zero() bool { return d == StatsDelta{} }

// Add adds o to d.
func (d *StatsDelta) Add(o StatsDelta) {
	d.Applied += o.Applied
	d.ReplaysSkipped += o.ReplaysSkipped
	d.Retries += o.Retries
	d.DeadLettered += o.DeadLettered
	d.CompletionFailures += o.CompletionFailures
	d.EpochChanges += o.EpochChanges
	if o.LastAppliedAt.After(d.LastAppliedAt) {
		d.LastAppliedAt = o.LastAppliedAt
	}
}

// DeadLetter is an item no processor could apply, kept whole.
type DeadLetter struct {
	ID         int64  `db:"id" json:"id"`
	Feed       string `db:"feed" json:"feed"`
	Partition  int32  `db:"partition" json:"partition"`
	Epoch      string `db:"epoch" json:"epoch"`
	Position   int64  `db:"position" json:"position"`
	Sequence   int64  `db:"sequence" json:"sequence"`
	Attempts   int    `db:"attempts" json:"attempts"`
	Reason     string `db:"reason" json:"reason"`
	Error      string `db:"error" json:"error"`
	Key        []byte `db:"key" json:"key"`
	Payload    []byte `db:"payload" json:"payload"`
	Headers    []byte `db:"headers" json:"-"`              // EncodeHeaders form
	At         int64  `db:"at" json:"at"`                  // unix nanoseconds
	RequeuedAt int64  `db:"requeued_at" json:"requeuedAt"` // unix nanoseconds, 0 = never
	// OutboxID and Topic name the outbox row and its topic when the dead
	// letter is an output the relay could not publish (ReasonOutputTooLarge):
	// Key, Payload and Headers are then the output's. nil and "" for an item.
	OutboxID *int64 `db:"outbox_id" json:"outboxId,omitempty"`
	Topic    string `db:"topic" json:"topic,omitempty"`
	Resolution
}

// Loss is input a feed moved past without keeping its effects.
type Loss struct {
	ID        int64  `db:"id"`
	Feed      string `db:"feed"`
	Partition int32  `db:"partition"`
	At        int64  `db:"at"` // unix nanoseconds
	Reason    string `db:"reason"`
	Epoch     string `db:"epoch"`
	From      int64  `db:"from_pos"`
	To        int64  `db:"to_pos"`     // -1 (ingest.UnknownPosition): the extent is unknown
	AckedAt   int64  `db:"acked_at"`   // unix nanoseconds, 0 = not acked
	AckedBy   string `db:"acked_by"`   // the API token's name, "" when not acked or acked before names
	AckReason string `db:"ack_reason"` // why the operator acknowledged it
}

// RegisterFeed records a feed's description, creating its row if new.
// Counters and positions of a known feed are kept.
func (s *Store) RegisterFeed(ctx context.Context, f FeedInfo) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO feeds (name, kind, source, processor) VALUES (?, ?, ?, ?)
ON CONFLICT(name) DO UPDATE SET kind = excluded.kind, source = excluded.source, processor = excluded.processor`,
		f.Name, f.Kind, f.Source, f.Processor)
	s.noteWrite(err)
	if err != nil {
		return fmt.Errorf("register feed %s: %w", f.Name, err)
	}
	return nil
}

// Positions returns the stored checkpoints of a feed, by partition. It reads
// through the writer connection: this is the authority a feed resumes from.
func (s *Store) Positions(ctx context.Context, feed string) (map[int32]Checkpoint, error) {
	var cs []Checkpoint
	if err := s.db.SelectContext(ctx, &cs, `SELECT partition, epoch, position, source_end, updated_at
FROM positions WHERE feed = ? ORDER BY partition`, feed); err != nil {
		return nil, fmt.Errorf("read positions of %s: %w", feed, err)
	}
	m := make(map[int32]Checkpoint, len(cs))
	for _, c := range cs {
		m[c.Partition] = c
	}
	return m, nil
}

// ReadPositions is Positions through the read-only pool, for status reads.
func (s *Store) ReadPositions(ctx context.Context, feed string) ([]Checkpoint, error) {
	var cs []Checkpoint
	if err := s.rdb.SelectContext(ctx, &cs, `SELECT partition, epoch, position, source_end, updated_at
FROM positions WHERE feed = ? ORDER BY partition`, feed); err != nil {
		return nil, fmt.Errorf("read positions of %s: %w", feed, err)
	}
	return cs, nil
}

const upsertPosition = `INSERT INTO positions (feed, partition, epoch, position, source_end, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT(feed, partition) DO UPDATE SET epoch = excluded.epoch, position = excluded.position,
source_end = excluded.source_end, updated_at = excluded.updated_at`

// SetPosition stores where a feed's partition stands.
func (tx *Tx) SetPosition(ctx context.Context, feed string, c Checkpoint) error {
	tx.touch(feed, c.Partition)
	st, err := tx.Stmt(ctx, upsertPosition)
	if err != nil {
		return err
	}
	if _, err := st.ExecContext(ctx, feed, c.Partition, c.Epoch, c.Position, c.End, tx.store.Now().UnixNano()); err != nil {
		return fmt.Errorf("store position of %s[%d]: %w", feed, c.Partition, err)
	}
	return nil
}

const addStats = `UPDATE feeds SET applied = applied + ?, replays_skipped = replays_skipped + ?,
retries = retries + ?, dead_lettered = dead_lettered + ?, completion_failures = completion_failures + ?,
epoch_changes = epoch_changes + ?, last_applied_at = max(last_applied_at, ?) WHERE name = ?`

// AddStats adds d to a feed's counters.
func (tx *Tx) AddStats(ctx context.Context, feed string, d StatsDelta) error {
	if d.Zero() {
		return nil
	}
	var last int64
	if !d.LastAppliedAt.IsZero() {
		last = d.LastAppliedAt.UnixNano()
	}
	st, err := tx.Stmt(ctx, addStats)
	if err != nil {
		return err
	}
	res, err := st.ExecContext(ctx, d.Applied, d.ReplaysSkipped, d.Retries, d.DeadLettered,
		d.CompletionFailures, d.EpochChanges, last, feed)
	if err != nil {
		return fmt.Errorf("update stats of %s: %w", feed, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("update stats of %s: feed %w", feed, ErrNotFound)
	}
	return nil
}

// DeadLetter stores d (its ID and At are assigned) and returns its id.
func (tx *Tx) DeadLetter(ctx context.Context, d DeadLetter) (int64, error) {
	tx.touch(d.Feed, d.Partition)
	// RETURNING, not LastInsertId: PostgreSQL's driver has none.
	var id int64
	err := tx.tx.GetContext(ctx, &id, `INSERT INTO dead_letters
(feed, partition, epoch, position, sequence, attempts, reason, error, key, payload, headers, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		d.Feed, d.Partition, d.Epoch, d.Position, d.Sequence, d.Attempts, tx.store.text(d.Reason), tx.store.text(d.Error),
		d.Key, d.Payload, d.Headers, tx.store.Now().UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store dead letter of %s at %d: %w", d.Feed, d.Position, err)
	}
	return id, nil
}

// MarkRequeued marks a dead letter requeued, by no one named (see
// MarkRequeuedBy). It returns false, changing nothing, if it was requeued
// or discarded already.
func (tx *Tx) MarkRequeued(ctx context.Context, feed string, id int64) (bool, error) {
	return tx.MarkRequeuedBy(ctx, feed, id, Requeue{})
}

// RecordLoss stores l (its At is assigned) and marks the feed not lossless.
func (tx *Tx) RecordLoss(ctx context.Context, l Loss) error {
	tx.touch(l.Feed, l.Partition)
	now := tx.store.Now().UnixNano()
	if _, err := tx.tx.ExecContext(ctx, `INSERT INTO losses (feed, partition, at, reason, epoch, from_pos, to_pos)
VALUES (?, ?, ?, ?, ?, ?, ?)`, l.Feed, l.Partition, now, l.Reason, l.Epoch, l.From, l.To); err != nil {
		return fmt.Errorf("record loss of %s: %w", l.Feed, err)
	}
	if _, err := tx.tx.ExecContext(ctx, `UPDATE feeds SET lossless = 0 WHERE name = ?`, l.Feed); err != nil {
		return fmt.Errorf("record loss of %s: %w", l.Feed, err)
	}
	return nil
}

// SetLastError stores a feed's last error ("" clears it).
func (s *Store) SetLastError(ctx context.Context, feed, msg string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE feeds SET last_error = ? WHERE name = ?`, s.text(msg), feed)
	if err != nil {
		// Only a failure counts for CheckWritable: this one-row update
		// usually fits in pages the database already has, so its success
		// after a commit failed on a full disk would vouch for a database
		// that still cannot take the batch the feed is stalled on.
		s.noteWrite(err)
		return fmt.Errorf("store last error of %s: %w", feed, err)
	}
	return nil
}

// AckLosses records that an operator reviewed a feed's losses, with no
// name or reason (see AckLossesBy). It returns the number of losses acked.
func (s *Store) AckLosses(ctx context.Context, feed string) (int64, error) {
	return s.AckLossesBy(ctx, feed, LossAck{})
}

// Feed returns a feed's stored description and counters.
func (s *Store) Feed(ctx context.Context, name string) (FeedStats, error) {
	var f FeedStats
	err := s.rdb.GetContext(ctx, &f, `SELECT * FROM feeds WHERE name = ?`, name)
	if errors.Is(err, sql.ErrNoRows) {
		return f, fmt.Errorf("feed %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return f, fmt.Errorf("read feed %s: %w", name, err)
	}
	return f, nil
}

// Feeds returns every stored feed, by name.
func (s *Store) Feeds(ctx context.Context) ([]FeedStats, error) {
	var fs []FeedStats
	if err := s.rdb.SelectContext(ctx, &fs, `SELECT * FROM feeds ORDER BY name`); err != nil {
		return nil, fmt.Errorf("read feeds: %w", err)
	}
	return fs, nil
}

// Losses returns a feed's losses, oldest first, acked ones included.
func (s *Store) Losses(ctx context.Context, feed string) ([]Loss, error) {
	var ls []Loss
	if err := s.rdb.SelectContext(ctx, &ls, `SELECT * FROM losses WHERE feed = ? ORDER BY id`, feed); err != nil {
		return nil, fmt.Errorf("read losses of %s: %w", feed, err)
	}
	return ls, nil
}

// DeadLetters returns up to limit dead letters of a feed with id > after.
func (s *Store) DeadLetters(ctx context.Context, feed string, after int64, limit int) ([]DeadLetter, error) {
	var ds []DeadLetter
	if err := s.rdb.SelectContext(ctx, &ds, `SELECT * FROM dead_letters WHERE feed = ? AND id > ? ORDER BY id LIMIT ?`,
		feed, after, limit); err != nil {
		return nil, fmt.Errorf("read dead letters of %s: %w", feed, err)
	}
	return ds, nil
}

// DeadLetterByID returns one dead letter of a feed.
func (s *Store) DeadLetterByID(ctx context.Context, feed string, id int64) (DeadLetter, error) {
	var d DeadLetter
	err := s.db.GetContext(ctx, &d, `SELECT * FROM dead_letters WHERE feed = ? AND id = ?`, feed, id)
	if errors.Is(err, sql.ErrNoRows) {
		return d, fmt.Errorf("dead letter %d of %s: %w", id, feed, ErrNotFound)
	}
	if err != nil {
		return d, fmt.Errorf("read dead letter %d of %s: %w", id, feed, err)
	}
	return d, nil
}
