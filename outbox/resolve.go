package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// Resolution is what an operator did with a dead letter besides requeueing
// it (DeadLetter.RequeuedAt): discarding it, who did either, and why. A
// resolved dead letter stays stored whole.
type Resolution struct {
	// DiscardedAt is when it was discarded, unix nanoseconds; 0: never.
	DiscardedAt int64 `db:"discarded_at" json:"discardedAt"`
	// ResolvedBy names who requeued or discarded it (the API token's
	// name); "" for one requeued before names, or not resolved.
	ResolvedBy string `db:"resolved_by" json:"resolvedBy"`
	// Note is the operator's reason for discarding it, or for requeueing
	// it edited.
	Note string `db:"resolution_note" json:"note"`
	// RequeuedPayload is the edited payload a requeue applied instead of
	// the stored one; nil when it applied the stored one.
	RequeuedPayload []byte `db:"requeued_payload" json:"-"`
}

// Resolved reports whether the dead letter was requeued or discarded.
func (d DeadLetter) Resolved() bool { return d.RequeuedAt != 0 || d.DiscardedAt != 0 }

// Requeue says who requeues a dead letter and, when the payload was
// edited, the payload applied (nil: the stored one).
type Requeue struct {
	By, Note string
	Payload  []byte
}

// MarkRequeuedBy marks dead letter id of feed requeued, in the transaction
// that applies it again, with who asked and the payload applied when it is
// not the stored one. It returns false, changing nothing, if the dead
// letter was requeued or discarded already (or is not there).
func (tx *Tx) MarkRequeuedBy(ctx context.Context, feed string, id int64, r Requeue) (bool, error) {
	res, err := tx.tx.ExecContext(ctx, `UPDATE dead_letters SET requeued_at = ?, resolved_by = ?, resolution_note = ?,
requeued_payload = ? WHERE feed = ? AND id = ? AND requeued_at = 0 AND discarded_at = 0`,
		tx.store.Now().UnixNano(), tx.store.text(r.By), tx.store.text(r.Note), r.Payload, feed, id)
	if err != nil {
		return false, fmt.Errorf("mark dead letter %d requeued: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("mark dead letter %d requeued: %w", id, err)
	}
	return n == 1, nil
}

// Discard says who discards dead letters, and why.
type Discard struct{ By, Note string }

// DiscardDeadLetter marks dead letter id of feed discarded: an operator
// decided it is not to be applied. It stays stored whole, with who and
// why, and can no longer be requeued. It returns false, changing nothing,
// when it was requeued or discarded already, and an error wrapping
// ErrNotFound when the feed has no such dead letter.
func (s *Store) DiscardDeadLetter(ctx context.Context, feed string, id int64, d Discard) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE dead_letters SET discarded_at = ?, resolved_by = ?, resolution_note = ?
WHERE feed = ? AND id = ? AND requeued_at = 0 AND discarded_at = 0`, s.Now().UnixNano(), s.text(d.By), s.text(d.Note), feed, id)
	s.noteWrite(err)
	if err != nil {
		return false, fmt.Errorf("discard dead letter %d of %s: %w", id, feed, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return true, nil
	}
	if _, err := s.DeadLetterByID(ctx, feed, id); err != nil {
		return false, err
	}
	return false, nil
}

// OpenDeadLetterIDs returns up to limit ids, after after in id order, of
// the dead letters of feed no one requeued or discarded; reason, when not
// "", keeps those of that reason only.
func (s *Store) OpenDeadLetterIDs(ctx context.Context, feed, reason string, after int64, limit int) ([]int64, error) {
	var ids []int64
	if err := s.rdb.SelectContext(ctx, &ids, `SELECT id FROM dead_letters WHERE feed = ? AND id > ?
AND requeued_at = 0 AND discarded_at = 0 AND (? = '' OR reason = ?) ORDER BY id LIMIT ?`,
		feed, after, reason, reason, limit); err != nil {
		return nil, fmt.Errorf("read open dead letters of %s: %w", feed, err)
	}
	return ids, nil
}

// OpenDeadLetterCount is how many dead letters of a feed no one resolved,
// counted up to a cap.
type OpenDeadLetterCount struct {
	Feed string `db:"feed"`
	// N counts them, at most the cap; AtLeast is true when the count
	// stopped at the cap.
	N       int64 `db:"n"`
	AtLeast bool  `db:"-"`
}

// openDeadLettersSQL counts a feed's open dead letters since a time, up
// to a cap, from the index of open ones.
const openDeadLettersSQL = `SELECT count(*) FROM (SELECT 1 FROM dead_letters INDEXED BY dead_letters_open
WHERE feed = ? AND at >= ? AND requeued_at = 0 AND discarded_at = 0 LIMIT ?)`

// OpenDeadLetters counts, per feed, the dead letters stored since since
// that no one requeued or discarded, each count stopping at limit (so a
// flood of them costs a bounded read: the count is of an index's entries,
// never of the rows). Feeds with none are left out.
func (s *Store) OpenDeadLetters(ctx context.Context, since time.Time, limit int64) ([]OpenDeadLetterCount, error) {
	var out []OpenDeadLetterCount
	err := s.readTx(ctx, func(tx *sqlx.Tx) error {
		var names []string
		if err := tx.SelectContext(ctx, &names, `SELECT name FROM feeds ORDER BY name`); err != nil {
			return fmt.Errorf("read feeds: %w", err)
		}
		for _, name := range names {
			var n int64
			if err := tx.GetContext(ctx, &n, openDeadLettersSQL, name, since.UnixNano(), limit); err != nil {
				return fmt.Errorf("count open dead letters of %s: %w", name, err)
			}
			if n > 0 {
				out = append(out, OpenDeadLetterCount{Feed: name, N: n, AtLeast: n >= limit})
			}
		}
		return nil
	})
	return out, err
}

// LossAck says who acknowledges a feed's losses, and why.
type LossAck struct{ By, Reason string }

// AckLossesBy records that an operator reviewed a feed's losses: they stay
// in the history, marked acked with who and why, and the feed is lossless
// again. It returns the number of losses acked (0 when none was left), and
// an error wrapping ErrNotFound for an unknown feed.
func (s *Store) AckLossesBy(ctx context.Context, feed string, a LossAck) (int64, error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("ack losses of %s: %w", feed, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE feeds SET lossless = 1 WHERE name = ?`, feed)
	if err != nil {
		return 0, fmt.Errorf("ack losses of %s: %w", feed, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return 0, fmt.Errorf("feed %s: %w", feed, ErrNotFound)
	}
	res, err = tx.ExecContext(ctx, `UPDATE losses SET acked_at = ?, acked_by = ?, ack_reason = ? WHERE feed = ? AND acked_at = 0`,
		s.Now().UnixNano(), s.text(a.By), s.text(a.Reason), feed)
	if err != nil {
		return 0, fmt.Errorf("ack losses of %s: %w", feed, err)
	}
	n, _ := res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("ack losses of %s: commit: %w", feed, err)
	}
	return n, nil
}

// DiscardDeadLetters discards, as DiscardDeadLetter does, every dead letter
// of feed of reason that no one requeued or discarded, in one transaction,
// and returns how many.
func (s *Store) DiscardDeadLetters(ctx context.Context, feed, reason string, d Discard) (int64, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE dead_letters SET discarded_at = ?, resolved_by = ?, resolution_note = ?
WHERE feed = ? AND reason = ? AND requeued_at = 0 AND discarded_at = 0`, s.Now().UnixNano(), s.text(d.By), s.text(d.Note), feed, reason)
	s.noteWrite(err)
	if err != nil {
		return 0, fmt.Errorf("discard the %s dead letters of %s: %w", reason, feed, err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}
