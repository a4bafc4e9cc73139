package relay

import (
	"context"
	"fmt"

	"github.com/outboxd/outboxd/outbox"
)

// runAtLeastOnce is one at-least-once session: an idempotent producer
// publishes each batch, and the batch is marked published in SQLite only
// after every record in it was acked. A crash or failure before the mark
// publishes the batch again, so a consumer may see it twice and drops
// repeats by their outboxd-id header. The producer is the exactly-once
// relay's without a transactional id: the same record batches, sent the
// same way, with no transaction around them.
func (r *Relay) runAtLeastOnce(stop stopping) (progressed bool, err error) {
	ctx := stop.soft
	if err := r.store.CheckOwner(ctx); err != nil {
		return false, err
	}
	p, err := openTxnProducer(ctx, r.cfg, "")
	if err != nil {
		return false, fmt.Errorf("start idempotent producer: %w", err)
	}
	defer func() { r.dropProducer(stop, p) }()
	p.resending = r.st.resending
	last, err := r.store.RelayProgress(ctx, r.relayID)
	if err != nil {
		return false, err
	}
	r.log.Info("resuming", "after", last)
	send := func(rows []outbox.Row, recs []*record) error {
		return r.publishAcked(stop.hard, p, rows, recs)
	}
	// After a refusal every batch of the refused send has its answer
	// (produce reads them all), and those that went out may go out
	// again; the producer's sequences ran past the refused batch, so a
	// new producer (a new id, sequences from 0) publishes the rest.
	reset := func() error {
		np, err := openTxnProducer(ctx, r.cfg, "")
		if err != nil {
			return fmt.Errorf("start idempotent producer: %w", err)
		}
		r.dropProducer(stop, p)
		p = np
		p.resending = r.st.resending
		return nil
	}
	return r.drain(ctx, last, func(rows []outbox.Row) error {
		if err := r.ensureOutputTopics(ctx, rows); err != nil {
			return err
		}
		return r.publish(ctx, rows, send, reset)
	})
}

// publishAcked publishes recs, the records of rows to publish, waits for
// every ack, then marks the rows published. ctx is the stopping's hard
// step: the batch in hand may be acked and marked after the relay was
// asked to stop.
func (r *Relay) publishAcked(ctx context.Context, p *txnProducer, rows []outbox.Row, recs []*record) error {
	first, last := rows[0].ID, rows[len(rows)-1].ID
	r.st.state(StatePublishing)
	if err := p.publishTxn(ctx, recs); err != nil {
		return fmt.Errorf("publish outbox rows %d..%d: %w", first, last, err)
	}
	if err := r.store.SetRelayProgress(ctx, r.relayID, last); err != nil {
		return fmt.Errorf("mark outbox rows %d..%d published: %w", first, last, err)
	}
	r.st.published(last, len(recs))
	r.recorded.Store(last)
	r.allowed()
	r.prunePublished()
	return nil
}
