package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// runExactlyOnce is one exactly-once session:
//
//  1. make a transactional producer: InitProducerID fences any earlier
//     producer with the transactional id and aborts (or completes) the
//     transaction it left open;
//  2. read its last committed progress from the progress topic, and resume
//     after the larger of Kafka's and SQLite's progress, unless Kafka's
//     names rows the database does not have;
//  3. per batch: one transaction holding the rows and a progress record
//     naming the last of them; after the commit, the progress goes to
//     SQLite. A row Kafka cannot take (too large) is a dead letter in
//     SQLite before the transaction that passes it commits (see publish).
//
// Any failure ends the session; the next one starts again from step 1, so
// an unknown outcome is settled by Kafka, never guessed.
func (r *Relay) runExactlyOnce(stop stopping) (progressed bool, err error) {
	ctx := stop.soft
	if err := r.ensureProgressTopic(ctx); err != nil {
		return false, err
	}
	if err := r.store.CheckOwner(ctx); err != nil {
		return false, err // never fence the process that owns the database now
	}
	p, err := openTxnProducer(ctx, r.cfg, r.txnID)
	if err != nil {
		return false, fmt.Errorf("start transactional producer %s: %w", r.txnID, err)
	}
	defer func() { r.dropProducer(stop, p) }()
	p.resending = r.st.resending
	last, err := r.resumeExactlyOnce(ctx)
	if err != nil {
		return false, err
	}
	send := func(rows []outbox.Row, recs []*record) error {
		return r.publishTxn(stop.hard, p, rows, recs)
	}
	// A transaction whose records a broker refused cannot commit: a new
	// producer fences this one, which aborts it at once. The transactions
	// committed before it stand, so publishing goes on from the refused
	// rows.
	reset := func() error {
		np, err := openTxnProducer(ctx, r.cfg, r.txnID)
		if err != nil {
			return fmt.Errorf("start transactional producer %s: %w", r.txnID, err)
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

// drain publishes the rows after last, batch by batch, until publish or the
// feeder fails (or ctx is done); progressed says whether a batch went out.
func (r *Relay) drain(ctx context.Context, last int64, publish func([]outbox.Row) error) (progressed bool, err error) {
	r.connected(last)
	f := r.startFeeder(ctx, last)
	defer f.close()
	for {
		rows, err := f.next(ctx, r.idle)
		if err != nil {
			return progressed, err
		}
		if err := publish(rows); err != nil {
			return progressed, err
		}
		progressed = true
	}
}

// publishTxn publishes recs, the records of rows to publish, and the
// progress after the last row in one transaction, then has the progress
// stored in SQLite. ctx is the stopping's hard step: the transaction in
// hand may commit after the relay was asked to stop.
func (r *Relay) publishTxn(ctx context.Context, p *txnProducer, rows []outbox.Row, recs []*record) error {
	last := &rows[len(rows)-1]
	pm, err := progressRecord(r.cfg.ProgressTopic, r.relayID, r.stamped(progressOf(last)))
	if err != nil {
		return err
	}
	r.st.state(StatePublishing)
	started := time.Now()
	// A copy: recs may be part of a longer slice whose next record the
	// progress must not overwrite.
	msgs := append(append(make([]*record, 0, len(recs)+1), recs...), pm)
	if err := p.publishTxn(ctx, msgs); err != nil {
		if isUnauthorized(err) {
			err = r.pinpointTxn(ctx, rows, err)
		}
		return fmt.Errorf("publish outbox rows %d..%d: %w", rows[0].ID, last.ID, err)
	}
	if r.cfg.OnTransaction != nil {
		r.cfg.OnTransaction(time.Since(started), len(recs))
	}
	r.st.published(last.ID, len(recs))
	r.rec.record(last.ID)
	r.allowed()
	return nil
}

// resumeExactlyOnce settles where publishing resumes: after the larger of
// Kafka's and SQLite's progress.
func (r *Relay) resumeExactlyOnce(ctx context.Context) (int64, error) {
	kp, found, err := r.kafka.readProgress(ctx, r.cfg.ProgressTopic, r.relayID)
	if err != nil {
		return 0, fmt.Errorf("read progress: %w", err)
	}
	sp, err := r.store.RelayProgress(ctx, r.relayID)
	if err != nil {
		return 0, err
	}
	if found {
		if err := r.checkProgress(ctx, kp, sp); err != nil {
			return 0, err
		}
	}
	from := sp
	if found && kp.LastID > sp {
		from = kp.LastID
		if err := r.store.SetRelayProgress(ctx, r.relayID, from); err != nil {
			return 0, err
		}
	}
	if found && kp.LastID < sp {
		r.log.Warn("Kafka's progress is behind SQLite's (progress topic recreated?); resuming after SQLite's",
			"kafka", kp.LastID, "sqlite", sp)
	}
	r.log.Info("resuming", "after", from, "kafka_progress", kp.LastID, "sqlite_progress", sp)
	return from, nil
}

// checkProgress refuses Kafka's progress kp when the database cannot have
// produced it: it names an id above any the database ever assigned, or a
// row the database has under that id is another one.
func (r *Relay) checkProgress(ctx context.Context, kp Progress, sqliteProgress int64) error {
	lastID, err := r.store.LastOutboxID(ctx)
	if err != nil {
		return err
	}
	if kp.LastID > lastID {
		return fmt.Errorf("%w: Kafka's progress says outbox row %d is published, but the largest id this database "+
			"ever assigned is %d (restored from an older copy?); refusing to publish", ErrBackInTime, kp.LastID, lastID)
	}
	if kp.LastID <= sqliteProgress {
		return nil // SQLite agrees: that row was published from this database
	}
	// Rows after SQLite's progress are never pruned, so the row is there.
	rows, err := r.store.Rows(ctx, kp.LastID-1, 1)
	if err != nil {
		return err
	}
	if len(rows) == 0 || !kp.names(&rows[0]) {
		return fmt.Errorf("%w: Kafka's progress names outbox row %d of feed %q at epoch %q position %d, "+
			"which this database does not hold (restored from an older copy?); refusing to publish",
			ErrBackInTime, kp.LastID, kp.Feed, kp.Epoch, kp.Position)
	}
	return nil
}

// pinpointTxn names the topic, of the transaction's output topics and the
// progress topic, that a refused transaction lacked Write on: see
// kafka.pinpoint.
func (r *Relay) pinpointTxn(ctx context.Context, rows []outbox.Row, err error) error {
	topics := []string{}
	need := map[string]string{}
	for i := range rows {
		if _, ok := need[rows[i].Topic]; !ok {
			topics = append(topics, rows[i].Topic)
			need[rows[i].Topic] = "Write"
		}
	}
	topics = append(topics, r.cfg.ProgressTopic)
	need[r.cfg.ProgressTopic] = "Write"
	return r.kafka.pinpoint(ctx, err, topics, need)
}
