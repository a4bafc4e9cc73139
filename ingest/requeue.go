package ingest

import (
	"bytes"
	"context"
	"fmt"

	"github.com/outboxd/outboxd/outbox"
)

// Requeue feeds dead letter id of this feed back through the processor as a
// new delivery (same place, next attempt), in one transaction that also
// marks it requeued: a dead letter is requeued at most once, however often
// it is asked. It returns false, changing nothing, when it was requeued
// already. If the processor fails again, nothing changes and the error is
// returned. Safe for concurrent use with Run: it waits for the batch in hand.
func (l *Loop) Requeue(ctx context.Context, id int64) (bool, error) {
	return l.RequeueWith(ctx, id, outbox.Requeue{})
}

// RequeueWith is Requeue recording who asked (r.By, r.Note) and, when
// r.Payload is not nil, applying it instead of the stored payload (an
// operator's edit of a malformed item; the dead letter keeps both). A
// payload equal to the stored one is no edit. A discarded dead letter is
// not requeued: false, changing nothing.
func (l *Loop) RequeueWith(ctx context.Context, id int64, r outbox.Requeue) (bool, error) {
	dl, err := l.store.DeadLetterByID(ctx, l.cfg.Name, id)
	if err != nil {
		return false, err
	}
	if dl.Resolved() {
		return false, nil
	}
	if r.Payload != nil && bytes.Equal(r.Payload, dl.Payload) {
		r.Payload = nil
	}
	if dl.OutboxID != nil {
		return false, fmt.Errorf("requeue dead letter %d: it is an output to %s that Kafka did not take (%s), not an item: "+
			"it stays in the store whole", id, dl.Topic, dl.Reason)
	}
	hs, err := outbox.DecodeHeaders(dl.Headers)
	if err != nil {
		return false, fmt.Errorf("requeue dead letter %d: %w", id, err)
	}
	l.applyMu.Lock()
	defer l.applyMu.Unlock()
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("requeue dead letter %d: %w", id, err)
	}
	defer tx.Rollback()
	l.recBegin()
	if ok, err := tx.MarkRequeuedBy(ctx, l.cfg.Name, id, r); err != nil || !ok {
		return false, err
	}
	l.seq++
	d := Delivery{Feed: l.cfg.Name, Partition: dl.Partition, Sequence: l.seq, Epoch: dl.Epoch,
		Position: dl.Position, Attempt: dl.Attempts + 1}
	if err := tx.BeginItem(d.Place()); err != nil {
		return false, err
	}
	item := Item{Key: dl.Key, Value: dl.Payload, Headers: hs}
	if r.Payload != nil {
		item.Value = r.Payload
	}
	l.recHandled(Record{Kind: RecordItem, Partition: dl.Partition, Epoch: dl.Epoch, Position: dl.Position, Item: item}, d)
	actx, cancel := l.newAttemptContext(ctx)
	defer cancel()
	if err := l.apply(actx, tx, d, item); err != nil {
		return false, fmt.Errorf("requeue dead letter %d: the processor failed again: %w", id, err)
	}
	if err := tx.EndItem(); err != nil {
		return false, err
	}
	if err := tx.AddStats(ctx, l.cfg.Name, outbox.StatsDelta{Applied: 1, LastAppliedAt: l.store.Now()}); err != nil {
		return false, err
	}
	l.recOutcome(Outcome{Result: ResultRequeued, DeadLetterID: id})
	l.recPrepare(l.cps)
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("requeue dead letter %d: %w", id, err)
	}
	l.recCommitted()
	l.log.Info("dead letter requeued and applied", "id", id, "position", dl.Position)
	return true, nil
}

// Processor is the processor's name, as configured.
func (l *Loop) Processor() string { return l.cfg.Processor }
