package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/outbox"
)

// sendFunc publishes the records of a span of rows (the rows not dead
// letters, in order) with the progress after the span's last row: one
// Kafka transaction, or one acked batch marked in SQLite. recs may be
// empty: the progress alone passes rows that are all dead letters.
type sendFunc func(rows []outbox.Row, recs []*record) error

// publish publishes a batch of rows with send, so that no row can stop the
// others. A row whose record is over Config.MaxMessageBytes is stored as a
// dead letter before send runs. When a broker refuses records as too large
// (its limit, or a topic's, is below the relay's), reset readies the
// producer again (aborting the refused transaction) and the rows are
// published in halves, and halves of those, until the refused row stands
// alone: it becomes a dead letter too and its half goes on without it.
//
// A dead letter is durable in SQLite before any transaction that passes its
// row commits, and storing one is idempotent, so a crash at any point
// neither loses a row nor counts one twice.
//
// The records are made in the slab of the last batch that went out (its
// records are settled: committed or acked); a batch that fails keeps its
// slab, whose records a dropped producer may still hold.
func (r *Relay) publish(ctx context.Context, rows []outbox.Row, send sendFunc, reset func() error) error {
	slab := r.spare.reuse(len(rows))
	r.spare = nil
	recs, err := r.records(ctx, rows, slab)
	if err != nil {
		return err
	}
	err = send(rows, recs)
	if err == nil {
		r.spare = slab
		return nil
	}
	if !isRefusedRecord(err) {
		return err
	}
	return r.split(ctx, rows, send, reset, err)
}

// ReasonOutputInvalidTimestamp is the reason of a dead letter the relay
// stores for an output a broker refused for its timestamp
// (INVALID_TIMESTAMP: older than the topic's
// message.timestamp.before.max.ms allows, or newer than its
// message.timestamp.after.max.ms, as a record stamped with its row's
// creation, Config.Timestamp, can be after a long outage).
const ReasonOutputInvalidTimestamp = "output-invalid-timestamp"

// isRefusedRecord reports a refusal of some record of a batch that
// sending the same record again meets again: too large, or a timestamp
// out of the topic's range. The relay finds the record and makes it a
// dead letter (see publish).
func isRefusedRecord(err error) bool { return isTooLarge(err) || isInvalidTimestamp(err) }

// isInvalidTimestamp reports a broker's INVALID_TIMESTAMP in err.
func isInvalidTimestamp(err error) bool { return errors.Is(err, sarama.ErrInvalidTimestamp) }

// split publishes rows, of which a broker refused some record (too large
// or its timestamp) with cause, in halves (see publish).
func (r *Relay) split(ctx context.Context, rows []outbox.Row, send sendFunc, reset func() error, cause error) error {
	if err := reset(); err != nil {
		return errors.Join(cause, err)
	}
	if len(rows) == 1 {
		if err := r.refuse(ctx, &rows[0], cause); err != nil {
			return err
		}
		return r.publish(ctx, rows, send, reset)
	}
	r.log.Warn("a broker refused records (too large, or their timestamps): publishing the batch in halves to find them",
		"first", rows[0].ID, "last", rows[len(rows)-1].ID, "err", cause)
	h := len(rows) / 2
	if err := r.publish(ctx, rows[:h], send, reset); err != nil {
		return err
	}
	return r.publish(ctx, rows[h:], send, reset)
}

// records returns the records of rows that are to be published, in order,
// made in slab.
// The rows over Config.MaxMessageBytes are stored as dead letters first;
// rows a broker refused in this session are left out (they are stored).
func (r *Relay) records(ctx context.Context, rows []outbox.Row, slab *recordSlab) ([]*record, error) {
	ms, err := slab.messages(rows)
	if err != nil {
		return nil, err
	}
	if r.cfg.Timestamp == TimestampPublish {
		now := time.Now().UnixMilli()
		for _, m := range ms {
			m.at = now
		}
	}
	recs := ms[:0]
	var big []outbox.RowDeadLetter
	for i, m := range ms {
		row := &rows[i]
		switch {
		case r.refused[row.ID]:
		case !fits(m, r.cfg.MaxMessageBytes):
			big = append(big, outbox.RowDeadLetter{Row: *row, Reason: outbox.ReasonOutputTooLarge,
				Error: fmt.Sprintf("a record of %d bytes (topic %s) is over the relay's limit of %d (--max-message-bytes)",
					m.size+outbox.RecordBatchOverhead, row.Topic, r.cfg.MaxMessageBytes)})
		default:
			recs = append(recs, m)
		}
	}
	if err := r.deadLetter(ctx, big); err != nil {
		return nil, err
	}
	return recs, nil
}

// refuse stores row, which a broker refused with cause (too large, or its
// timestamp), as a dead letter, and leaves it out of this session's
// records.
func (r *Relay) refuse(ctx context.Context, row *outbox.Row, cause error) error {
	dl := outbox.RowDeadLetter{Row: *row, Reason: outbox.ReasonOutputTooLarge,
		Error: fmt.Sprintf("a broker refused the record (topic %s) as too large: %v", row.Topic, cause)}
	if !isTooLarge(cause) {
		dl.Reason = ReasonOutputInvalidTimestamp
		dl.Error = fmt.Sprintf("a broker refused the record (topic %s) for its timestamp (--relay-timestamp %s; "+
			"the row was created at %s): %v",
			row.Topic, r.cfg.Timestamp, time.Unix(0, row.CreatedAt).UTC().Format(time.RFC3339Nano), cause)
	}
	if err := r.deadLetter(ctx, []outbox.RowDeadLetter{dl}); err != nil {
		return err
	}
	r.refused[row.ID] = true
	return nil
}

// deadLetter stores dls in SQLite, durably, and counts them.
func (r *Relay) deadLetter(ctx context.Context, dls []outbox.RowDeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	added, err := r.store.DeadLetterRows(ctx, dls)
	if err != nil {
		return fmt.Errorf("%w: %w", errStore, err)
	}
	for _, d := range dls {
		r.log.Warn("an output cannot be published: stored as a dead letter of its feed",
			"id", d.Row.ID, "feed", d.Row.Feed, "topic", d.Row.Topic, "reason", d.Reason, "err", d.Error)
	}
	r.st.update(func(s *Status) { s.DeadLettered += int64(added) })
	return nil
}

// isTooLarge reports whether err says a record or a batch is too large:
// a broker's MESSAGE_TOO_LARGE or RECORD_LIST_TOO_LARGE, or the producer's
// own refusal of a record over its MaxMessageBytes. Retrying the same
// records gets the same answer, so the relay does not: it finds the row
// and makes it a dead letter (see publish).
func isTooLarge(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrMessageSetSizeTooLarge) {
		return true
	}
	var ce sarama.ConfigurationError
	return errors.As(err, &ce) && strings.Contains(string(ce), "MaxMessageBytes")
}
