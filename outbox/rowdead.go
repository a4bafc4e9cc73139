package outbox

import (
	"context"
	"fmt"
)

// ReasonOutputTooLarge is the reason of a dead letter the relay stores for
// an output Kafka does not take: a record over the relay's limit, or one a
// broker refused as too large.
const ReasonOutputTooLarge = "output-too-large"

// RowDeadLetter is an outbox row the relay cannot publish, and why.
type RowDeadLetter struct {
	Row    Row
	Reason string
	Error  string
}

// DeadLetterRows stores each row as a dead letter of its feed, whole (the
// row's key, its value as the payload, its headers, place and topic, its
// outbox id), and counts it in the feed's dead-lettered count, in one
// transaction that is durable when DeadLetterRows returns. A row stored
// already (the same outbox id) is left as it is and not counted again, so
// the relay may store a row again after a crash. It returns how many rows
// were new. A feed the store does not know yet gets its row.
func (s *Store) DeadLetterRows(ctx context.Context, dls []RowDeadLetter) (int, error) {
	if len(dls) == 0 {
		return 0, nil
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store dead letters of outbox rows: %w", err)
	}
	defer tx.Rollback()
	added := 0
	now := s.Now().UnixNano()
	for _, d := range dls {
		r := &d.Row
		if _, err := tx.ExecContext(ctx, `INSERT INTO feeds (name) VALUES (?) ON CONFLICT(name) DO NOTHING`, r.Feed); err != nil {
			return 0, fmt.Errorf("store dead letter of outbox row %d: %w", r.ID, err)
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO dead_letters
(feed, partition, epoch, position, sequence, attempts, reason, error, key, payload, headers, at, outbox_id, topic)
VALUES (?, ?, ?, ?, 0, 1, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(outbox_id) DO NOTHING`,
			r.Feed, r.Partition, r.Epoch, r.Position, s.text(d.Reason), s.text(d.Error), r.Key, r.Value, r.Headers, now, r.ID, r.Topic)
		if err != nil {
			return 0, fmt.Errorf("store dead letter of outbox row %d: %w", r.ID, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("store dead letter of outbox row %d: %w", r.ID, err)
		}
		if n == 0 {
			continue // stored before
		}
		if _, err := tx.ExecContext(ctx, `UPDATE feeds SET dead_lettered = dead_lettered + 1 WHERE name = ?`, r.Feed); err != nil {
			return 0, fmt.Errorf("count dead letter of outbox row %d: %w", r.ID, err)
		}
		added++
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store dead letters of outbox rows: commit: %w", err)
	}
	return added, nil
}
