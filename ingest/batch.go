package ingest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// batch is a run of records and the sequence of each item.
type batch struct {
	recs []Record
	seqs []int64 // per record; 0 for epoch changes and losses
	// requeue, when set, is the requeue whose item is the one record.
	requeue *requeueReq
}

// newBatch numbers recs' items from the loop's sequence.
func (l *Loop) newBatch(recs []Record) batch {
	b := batch{recs: recs, seqs: make([]int64, len(recs))}
	for i, r := range recs {
		if r.Kind == RecordItem {
			l.seq++
			if r.Replayed != nil { // a replay numbers as the recorded run did
				l.seq = r.Replayed.Sequence
			}
			b.seqs[i] = l.seq
		}
	}
	return b
}

func (b batch) from(i int) batch { return batch{recs: b.recs[i:], seqs: b.seqs[i:]} }

// first is the batch's first n records (all, when it has fewer).
func (b batch) first(n int) batch {
	n = min(n, len(b.recs))
	return batch{recs: b.recs[:n], seqs: b.seqs[:n]}
}

// work is one transaction's work in progress over the records of a batch.
type work struct {
	tx      *outbox.Tx
	cps     map[int32]outbox.Checkpoint // the checkpoints as they will be after commit
	touched map[int32]bool              // the partitions whose checkpoint changed
	delta   outbox.StatsDelta
	logs    []func() // run after commit
	records int      // records the transaction covers
	requeue bool     // the transaction is a requeue's
}

// newWork starts the bookkeeping of a transaction from the committed
// checkpoints.
func (l *Loop) newWork(tx *outbox.Tx) *work {
	cps := maps.Clone(l.cps)
	if cps == nil {
		cps = map[int32]outbox.Checkpoint{}
	}
	return &work{tx: tx, cps: cps, touched: map[int32]bool{}}
}

// advance moves partition p's checkpoint to position pos of epoch.
func (w *work) advance(p int32, epoch string, pos int64) {
	w.cps[p] = outbox.Checkpoint{Partition: p, Epoch: epoch, Position: pos}
	w.touched[p] = true
}

// afterCommit runs f once the transaction has committed.
func (w *work) afterCommit(f func()) { w.logs = append(w.logs, f) }

// transact applies b's records in one transaction, stopping before an item
// that fails transiently, and commits; attempt and spent are the tries of
// b's first record, and retried counts a retry of it in the stats although
// b does not hold it (its try was lost with a transaction). A requeue's
// batch (b.requeue) is applied by applyRequeue.
func (l *Loop) transact(ctx context.Context, b batch, attempt int, spent error, retried bool) result {
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return result{storeFailed: err}
	}
	defer tx.Rollback()
	l.obs.begun()
	w := l.newWork(tx)
	if b.requeue != nil {
		return l.applyRequeue(ctx, w, b)
	}
	if retried {
		w.delta.Retries++
	}
	if err := l.prepare(ctx, w, b); err != nil {
		// Every record of b was about to be taken in: under the skip
		// policy a read that keeps failing is looked for in pieces, as a
		// write would be.
		return result{storeFailed: err, reached: len(b.recs)}
	}
	n, itemFailed := len(b.recs), error(nil)
	for i, r := range b.recs {
		ai, si := attempt, spent
		if i > 0 {
			ai, si = replayedTries(r)
		}
		st := l.applyRecord(ctx, w, r, b.seqs[i], ai, si)
		if st.txLost {
			return result{itemFailed: st.itemFailed, txLost: true, reached: i + 1}
		}
		if st.storeFailed != nil {
			return result{storeFailed: st.storeFailed, reached: i + 1}
		}
		if st.itemFailed != nil {
			n, itemFailed = i, st.itemFailed
			break
		}
	}
	w.records = n
	if err := l.finish(ctx, w); err != nil {
		return result{storeFailed: err, reached: n}
	}
	return result{committed: n, itemFailed: itemFailed}
}

// finish writes the transaction's checkpoints and stats, commits, and then
// lets the feed forget what is now stored.
func (l *Loop) finish(ctx context.Context, w *work) error {
	ends := l.feed.Ends()
	var through []outbox.Checkpoint
	for p := range w.touched {
		c := w.cps[p]
		c.Partition, c.End = p, ends[p]
		w.cps[p] = c
		if err := w.tx.SetPosition(ctx, l.cfg.Name, c); err != nil {
			return err
		}
		through = append(through, c)
	}
	if w.delta.Applied > 0 {
		// The batch's items take effect together, at this commit.
		w.delta.LastAppliedAt = l.store.Now()
	}
	if err := w.tx.AddStats(ctx, l.cfg.Name, w.delta); err != nil {
		return err
	}
	var took time.Duration
	err := l.obs.commit(w.cps, func() error {
		started := time.Now()
		err := w.tx.Commit()
		took = time.Since(started)
		return err
	})
	if err != nil {
		return err
	}
	if w.requeue {
		return nil // no batch of the feed: its positions and status stand
	}
	if l.cfg.OnBatch != nil {
		l.cfg.OnBatch(w.records, took)
	}
	l.cps = w.cps
	for _, f := range w.logs {
		f()
	}
	l.status.committed(l.cps)
	if w.records > 0 { // not only the stats of an item's failed try
		l.status.setError(nil)
	}
	if len(through) > 0 {
		if err := l.feed.Commit(ctx, through); err != nil {
			l.log.Warn("feed commit failed (the store's position stands)", "err", err)
		}
	}
	return nil
}

// skip moves the feed past recs without their effects, counting a
// completion failure and recording the loss of each partition's range of
// skipped items; cause is why they could not commit.
func (l *Loop) skip(ctx context.Context, recs []Record, cause error) error {
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	l.obs.begun()
	w := l.newWork(tx)
	lost := map[int32]outbox.Loss{}
	for _, r := range recs {
		switch r.Kind {
		case RecordLoss:
			l.obs.handled(r, Delivery{}, Outcome{})
			if err := l.storeLoss(ctx, w, r); err != nil {
				return err
			}
			continue
		case RecordEpoch:
			l.obs.handled(r, Delivery{}, Outcome{})
			l.changeEpoch(w, r.Partition, r.Epoch, r.Position)
			continue
		}
		l.obs.handled(r, Delivery{Feed: l.cfg.Name, Partition: r.Partition, Topic: r.Topic, Epoch: r.Epoch, Position: r.Position},
			Outcome{Result: ResultSkipped})
		p, cp := r.Partition, w.cps[r.Partition]
		if _, ok := lost[p]; !ok {
			from := cp.Position
			if cp.Epoch != r.Epoch {
				from = 0
			}
			lost[p] = outbox.Loss{Feed: l.cfg.Name, Partition: p, Epoch: r.Epoch, From: from,
				Reason: "completion failure skipped: " + cause.Error()}
		}
		loss := lost[p]
		loss.To = r.Position
		lost[p] = loss
		w.advance(p, r.Epoch, r.Position)
	}
	for _, loss := range lost {
		if err := tx.RecordLoss(ctx, loss); err != nil {
			return err
		}
		l.obs.handled(Record{Kind: RecordLoss, Partition: loss.Partition, Epoch: loss.Epoch,
			From: loss.From, To: loss.To, Reason: loss.Reason}, Delivery{}, Outcome{})
	}
	w.delta.CompletionFailures = 1
	w.records = len(recs)
	l.log.Error("completion failure: skipping, the feed is no longer lossless", "records", len(recs), "err", cause)
	return l.finish(ctx, w)
}

// applyRecord handles one record inside w, at its try attempt (spent: to
// be dead-lettered with that error).
func (l *Loop) applyRecord(ctx context.Context, w *work, r Record, seq int64, attempt int, spent error) result {
	switch r.Kind {
	case RecordEpoch:
		l.obs.handled(r, Delivery{}, Outcome{})
		l.changeEpoch(w, r.Partition, r.Epoch, r.Position)
		return result{}
	case RecordLoss:
		l.obs.handled(r, Delivery{}, Outcome{})
		return result{storeFailed: l.storeLoss(ctx, w, r)}
	}
	cp := w.cps[r.Partition]
	d := Delivery{Feed: l.cfg.Name, Partition: r.Partition, Topic: r.Topic, Sequence: seq, Epoch: r.Epoch, Position: r.Position, Attempt: attempt}
	if d.AlreadyApplied(cp.Epoch, cp.Position) {
		w.delta.ReplaysSkipped++
		l.obs.handled(r, d, Outcome{Result: ResultReplaySkipped})
		return result{}
	}
	if cp.Epoch != r.Epoch {
		l.changeEpoch(w, r.Partition, r.Epoch, 0)
	}
	st, o := l.applyItem(ctx, w, d, r, spent)
	l.obs.handled(r, d, o)
	if st == (result{}) {
		w.advance(r.Partition, r.Epoch, r.Position)
	}
	return st
}

// applyItem runs the processor in a savepoint, or dead-letters the item;
// the Outcome is zero when the transaction failed before one. d.Attempt
// is the try; spent, when set, dead-letters the item with that error.
func (l *Loop) applyItem(ctx context.Context, w *work, d Delivery, r Record, spent error) (result, Outcome) {
	switch {
	case r.BadReason != "":
		return l.deadLettered(ctx, w, d, r, r.BadReason, r.BadErr, 1, ResultDeadLettered)
	case spent != nil:
		return l.deadLettered(ctx, w, d, r, reasonOf(spent, ReasonRetriesSpent), spent, d.Attempt, ResultSpent)
	}
	if d.Attempt > 1 {
		w.delta.Retries++
	}
	st, err := l.runItem(l.attemptContext(ctx), w, d, r.Item)
	if st != (result{}) {
		return st, Outcome{}
	}
	if err == nil {
		w.delta.Applied++
		return result{}, Outcome{Result: ResultApplied}
	}
	if p, ok := IsPermanent(err); ok {
		return l.deadLettered(ctx, w, d, r, p.Reason, p.Err, max(d.Attempt, p.Attempts), ResultDeadLettered)
	}
	if outbox.Classify(err) == outbox.ClassConstraint {
		// The item's writes broke a rule of the schema: they would again.
		return l.deadLettered(ctx, w, d, r, ReasonConstraint, err, d.Attempt, ResultDeadLettered)
	}
	return result{itemFailed: err}, Outcome{Result: ResultRetried, Error: err.Error()}
}

// runItem runs the processor on item with the attempt's context actx, in
// a savepoint of w's transaction. It returns the processor's error (its
// writes rolled back) or nil (they stand), or a result saying that the
// store failed or that the item's failure lost the transaction.
func (l *Loop) runItem(actx context.Context, w *work, d Delivery, item Item) (result, error) {
	if err := w.tx.BeginItem(d.Place()); err != nil {
		return result{storeFailed: err}, nil
	}
	err := l.apply(actx, w.tx, d, item)
	if err == nil {
		if err = w.tx.EndItem(); err == nil {
			return result{}, nil
		}
		if !errors.Is(err, outbox.ErrTxLost) {
			return result{storeFailed: err}, nil
		}
		// The processor went on after a statement that ended the
		// transaction: the item failed.
		return result{itemFailed: err, txLost: true}, nil
	}
	if outbox.Classify(err).Store() {
		// The database failed under the processor (a full disk, an I/O
		// error): not the item's fault, and the transaction is lost.
		return result{storeFailed: err}, nil
	}
	if rerr := w.tx.RollbackItem(); rerr != nil {
		if errors.Is(rerr, outbox.ErrTxLost) {
			return result{itemFailed: err, txLost: true}, nil
		}
		return result{storeFailed: rerr}, nil
	}
	return result{}, err
}

// apply runs the processor with the attempt's context actx, turning a
// panic into a permanent failure.
func (l *Loop) apply(actx context.Context, tx *outbox.Tx, d Delivery, item Item) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = Permanent("panic", fmt.Errorf("processor panicked: %v", p))
		}
	}()
	return l.proc.Apply(actx, tx, d, item)
}

// attemptContext is the context of an attempt starting now, bounded by the
// attempt timeout and not cancelled by a shutdown (the batch in hand is
// finished). A timer per item costs as much as a small item's work, so
// attempts that start within attemptReuse of a context's creation share
// it: each attempt has at least AttemptTimeout - attemptReuse.
func (l *Loop) attemptContext(ctx context.Context) context.Context {
	timeout := l.cfg.Retry.AttemptTimeout
	if timeout <= 0 {
		return context.WithoutCancel(ctx)
	}
	a := &l.attempt
	// time.Since reads only the monotonic clock, where time.Now reads the
	// wall clock too: half the cost, paid for every item.
	if a.ctx != nil && a.ctx.Err() == nil && time.Since(a.at) <= attemptReuse(timeout) {
		return a.ctx
	}
	a.stop()
	a.at = time.Now()
	a.ctx, a.cancel = l.newAttemptContext(ctx)
	return a.ctx
}

// newAttemptContext is a context of its own for one attempt: bounded by the
// attempt timeout (if any), not cancelled by ctx's cancellation.
func (l *Loop) newAttemptContext(ctx context.Context) (context.Context, context.CancelFunc) {
	actx := context.WithoutCancel(ctx)
	if t := l.cfg.Retry.AttemptTimeout; t > 0 {
		return context.WithTimeout(actx, t)
	}
	return actx, func() {}
}

// attemptReuse is how long after its creation an attempt context may be
// handed to another attempt: a sixty-fourth of the timeout, at most 5ms.
func attemptReuse(timeout time.Duration) time.Duration {
	return min(timeout/64, 5*time.Millisecond)
}

// sharedAttempt is the attempt context the loop's items share.
type sharedAttempt struct {
	ctx    context.Context
	cancel context.CancelFunc
	at     time.Time
}

// stop releases the context's timer.
func (a *sharedAttempt) stop() {
	if a.cancel != nil {
		a.cancel()
	}
	*a = sharedAttempt{}
}

func reasonOf(err error, fallback string) string {
	if p, ok := IsPermanent(err); ok {
		return p.Reason
	}
	return fallback
}

// Dead-letter headers, on records of the dead-letter topic, after the
// item's own (the relay keeps a Kafka item's outboxd-id, -feed, -epoch and
// -position as outboxd-orig-*).
const (
	HeaderReason   = "outboxd-reason"
	HeaderError    = "outboxd-error"
	HeaderAttempts = "outboxd-attempts"
	HeaderDeadID   = "outboxd-dead-letter-id"
	// HeaderTruncated is on a copy cut to fit the record limit
	// (Config.MaxMessageBytes): PART=BYTES for each part cut, comma
	// separated, BYTES its size before: value, error (this header's
	// HeaderError), headers (the item's, dropped), key. The dead letter
	// in the store is whole.
	HeaderTruncated = "outboxd-truncated"
)

// deadLetter stores the item whole and emits it to the dead-letter topic, in
// the transaction that moves the position past it.
func (l *Loop) deadLetter(ctx context.Context, w *work, d Delivery, r Record, reason string, cause error, attempts int) error {
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
	}
	id, err := w.tx.DeadLetter(ctx, outbox.DeadLetter{
		Feed: d.Feed, Partition: d.Partition, Epoch: d.Epoch, Position: d.Position, Sequence: d.Sequence,
		Attempts: attempts, Reason: reason, Error: msg,
		Key: r.Item.Key, Payload: r.Item.Value, Headers: outbox.EncodeHeaders(r.Item.Headers),
	})
	if err != nil {
		return err
	}
	own := deadLetterHeaders{reason: reason, err: msg, attempts: attempts, id: id}
	out := own.output(d.Place(), l.cfg.DeadLetterTopic, r.Item, l.cfg.MaxMessageBytes)
	w.tx.SetPlace(d.Place())
	if err := w.tx.Emit(ctx, out); err != nil {
		return err
	}
	w.delta.DeadLettered++
	w.advance(r.Partition, r.Epoch, r.Position)
	w.afterCommit(func() {
		l.log.Warn("dead-lettered", "partition", d.Partition, "position", d.Position, "reason", reason, "err", cutText(msg, maxCutError))
	})
	return nil
}

func (l *Loop) changeEpoch(w *work, p int32, epoch string, pos int64) {
	old := w.cps[p]
	w.advance(p, epoch, pos)
	if old.Epoch == epoch {
		return
	}
	if old.Epoch != "" {
		w.delta.EpochChanges++
	}
	w.afterCommit(func() {
		l.log.Info("new epoch: every item of it is applied", "partition", p, "epoch", epoch, "previous", old.Epoch, "from", pos)
	})
}

func (l *Loop) storeLoss(ctx context.Context, w *work, r Record) error {
	err := w.tx.RecordLoss(ctx, outbox.Loss{
		Feed: l.cfg.Name, Partition: r.Partition, Reason: r.Reason, Epoch: r.Epoch, From: r.From, To: r.To,
	})
	if err != nil {
		return err
	}
	w.afterCommit(func() {
		l.log.Error("input lost before it was read: the feed is no longer lossless",
			"partition", r.Partition, "epoch", r.Epoch, "from", r.From, "to", r.To, "reason", r.Reason)
	})
	return nil
}
