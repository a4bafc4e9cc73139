package ingest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// tries is what the loop knows of a batch's first item from its earlier
// tries.
type tries struct {
	attempt int   // the try this is (1 = first)
	spent   error // set when it must not be tried again: dead-letter it with this
}

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

// outcome is what one transaction over the start of a batch came to.
type outcome struct {
	// committed counts the records committed, from the batch's first.
	committed int
	// itemFailed is the transient error of the item right after them: it
	// is tried again alone, after a backoff.
	itemFailed error
	// storeFailed is why the transaction did not commit; then nothing of it
	// did, and reached counts the records it had taken in, the one being
	// applied when the store failed included.
	storeFailed error
	reached     int
}

// step is what applying one record inside a transaction came to; at most
// one of itemFailed and storeFailed is set.
type step struct {
	itemFailed  error // the item failed transiently: nothing of it is kept
	storeFailed error // the store failed: the transaction is lost
	// txLost: SQLite rolled the whole transaction back when the item
	// failed (an interrupted write): itemFailed is the item's error, and
	// nothing of the transaction stands.
	txLost bool
}

// process applies and commits recs, in as many transactions as it takes.
// An item failing transiently ends the transaction before it (the items
// ahead of it are committed) and is tried again alone after a backoff; a
// transaction the store fails is retried, cut in pieces or stalled on, as
// the error and the completion failure policy say (see storeFailed). It
// returns an error only when the feed cannot go on (see Run), or ctx's
// error when ctx ends while it waits. The waits between transactions apply
// the requeues that come meanwhile, so a requeue is never held up by a
// stall.
func (l *Loop) process(ctx context.Context, recs []Record) error {
	p := l.newPass(l.newBatch(recs))
	for len(p.b.recs) > 0 {
		out := l.applyOnce(ctx, p.b.first(p.limit), p.head)
		var err error
		if out.storeFailed != nil {
			err = l.storeFailed(ctx, p, out)
		} else {
			err = l.committed(ctx, p, out)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// committed moves p past what a transaction committed, and decides what
// follows the transient failure of the item after it, if any.
func (l *Loop) committed(ctx context.Context, p *pass, out outcome) error {
	stallEnded := false
	if out.committed > 0 || out.itemFailed == nil {
		stallEnded = p.stalled
		l.resumed(ctx, p) // it moved: whatever stalled it is gone
	}
	// Whole; or the piece that held the item to dead-letter is in; or a
	// piece ended a stall, so its cause (a full disk, a database that
	// could not be written) is gone and the rest of the batch need not go
	// a record at a time: should it fail again, it is cut again.
	if !p.pieces || (out.committed > 0 && p.head.spent != nil) || stallEnded {
		p.whole()
	}
	p.b = p.b.from(out.committed)
	if out.committed > 0 { // a new first item: its own tries start over
		p.head = firstTries(p.b)
		p.itemWait.Reset()
	}
	if out.itemFailed == nil {
		return nil
	}
	var err error
	p.head, err = l.afterItemFailure(ctx, p, out.itemFailed)
	return err
}

// afterItemFailure decides what follows a transient failure of the first
// item of p: another try after a backoff, or its failure policy once its
// tries are spent: a dead letter, or a stall that tries it again slowly
// until it succeeds.
func (l *Loop) afterItemFailure(ctx context.Context, p *pass, failed error) (tries, error) {
	r, h := p.b.recs[0], p.head
	l.status.setError(failed)
	if h.attempt < l.cfg.Retry.Attempts {
		wait := p.itemWait.NextBackOff()
		l.log.Warn("item failed: will retry", "partition", r.Partition, "position", r.Position, "attempt", h.attempt, "wait", wait, "err", failed)
		if err := l.wait(ctx, wait); err != nil {
			return h, err
		}
		return tries{attempt: h.attempt + 1}, nil
	}
	if l.cfg.OnFailure == OnFailureStop {
		cause := fmt.Errorf("item at %s[%d] position %d failed %d times: %w", l.cfg.Name, r.Partition, r.Position, h.attempt, failed)
		if err := l.stallOn(ctx, p, cause); err != nil {
			return h, err
		}
		return tries{attempt: h.attempt + 1}, nil
	}
	l.log.Warn("retries spent: dead-lettering", "partition", r.Partition, "position", r.Position, "attempts", h.attempt, "err", failed)
	return tries{attempt: h.attempt, spent: failed}, nil
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

// applyOnce applies b's records in one transaction, stopping before an item
// that fails transiently, and commits.
//
// When an item's failure made SQLite roll the whole transaction back (a
// write interrupted by the attempt's deadline), nothing of it stands: the
// records before the item are applied again in a new transaction, and the
// failure counts against the item, as any other of its transient failures
// (another try after a backoff, then its failure policy). It is not the
// store's failure: nothing is wrong with the database.
func (l *Loop) applyOnce(ctx context.Context, b batch, h tries) outcome {
	out, lostAt := l.transact(ctx, b, h, false)
	if lostAt < 0 {
		return out
	}
	r := b.recs[lostAt]
	l.log.Warn("an item's failure rolled the whole transaction back: applying the records before it again",
		"partition", r.Partition, "position", r.Position, "records", lostAt, "err", out.itemFailed)
	redo, again := l.transact(ctx, b.first(lostAt), h, lostAt == 0 && h.attempt > 1)
	if again >= 0 || redo.storeFailed != nil || redo.itemFailed != nil {
		// A record before the item failed this time: that comes first; the
		// item is tried again when its turn comes.
		return redo
	}
	return outcome{committed: redo.committed, itemFailed: out.itemFailed}
}

// transact applies b's records in one transaction, stopping before an item
// that fails transiently, and commits; retried counts a retry of the first
// record in the stats although b does not hold it (its try was lost with a
// transaction). It returns the index of the record whose failure lost the
// transaction, nothing committed, or -1. A requeue's batch (b.requeue)
// is applied by applyRequeue.
func (l *Loop) transact(ctx context.Context, b batch, h tries, retried bool) (outcome, int) {
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return outcome{storeFailed: err}, -1
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
		return outcome{storeFailed: err, reached: len(b.recs)}, -1
	}
	n, itemFailed := len(b.recs), error(nil)
	for i, r := range b.recs {
		hi := replayedTries(r)
		if i == 0 {
			hi = h
		}
		st := l.applyRecord(ctx, w, r, b.seqs[i], hi)
		if st.txLost {
			return outcome{itemFailed: st.itemFailed}, i
		}
		if st.storeFailed != nil {
			return outcome{storeFailed: st.storeFailed, reached: i + 1}, -1
		}
		if st.itemFailed != nil {
			n, itemFailed = i, st.itemFailed
			break
		}
	}
	w.records = n
	if err := l.finish(ctx, w); err != nil {
		return outcome{storeFailed: err, reached: n}, -1
	}
	return outcome{committed: n, itemFailed: itemFailed}, -1
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

// applyRecord handles one record inside w.
func (l *Loop) applyRecord(ctx context.Context, w *work, r Record, seq int64, h tries) step {
	switch r.Kind {
	case RecordEpoch:
		l.obs.handled(r, Delivery{}, Outcome{})
		l.changeEpoch(w, r.Partition, r.Epoch, r.Position)
		return step{}
	case RecordLoss:
		l.obs.handled(r, Delivery{}, Outcome{})
		return step{storeFailed: l.storeLoss(ctx, w, r)}
	}
	cp := w.cps[r.Partition]
	d := Delivery{Feed: l.cfg.Name, Partition: r.Partition, Topic: r.Topic, Sequence: seq, Epoch: r.Epoch, Position: r.Position, Attempt: h.attempt}
	if !l.seam.DisableGuard && d.AlreadyApplied(cp.Epoch, cp.Position) {
		w.delta.ReplaysSkipped++
		l.obs.handled(r, d, Outcome{Result: ResultReplaySkipped})
		return step{}
	}
	if cp.Epoch != r.Epoch {
		l.changeEpoch(w, r.Partition, r.Epoch, 0)
	}
	st, o := l.applyItem(ctx, w, d, r, h)
	l.obs.handled(r, d, o)
	if st == (step{}) {
		w.advance(r.Partition, r.Epoch, r.Position)
	}
	return st
}

// applyItem runs the processor in a savepoint, or dead-letters the item;
// the Outcome is zero when the transaction failed before one.
func (l *Loop) applyItem(ctx context.Context, w *work, d Delivery, r Record, h tries) (step, Outcome) {
	switch {
	case r.BadReason != "":
		return l.deadLettered(ctx, w, d, r, r.BadReason, r.BadErr, 1, ResultDeadLettered)
	case h.spent != nil:
		return l.deadLettered(ctx, w, d, r, reasonOf(h.spent, ReasonRetriesSpent), h.spent, h.attempt, ResultSpent)
	}
	if h.attempt > 1 {
		w.delta.Retries++
	}
	st, err := l.runItem(l.attemptContext(ctx), w, d, r.Item)
	if st != (step{}) {
		return st, Outcome{}
	}
	if err == nil {
		w.delta.Applied++
		return step{}, Outcome{Result: ResultApplied}
	}
	if p, ok := IsPermanent(err); ok {
		return l.deadLettered(ctx, w, d, r, p.Reason, p.Err, max(h.attempt, p.Attempts), ResultDeadLettered)
	}
	if outbox.Classify(err) == outbox.ClassConstraint {
		// The item's writes broke a rule of the schema: they would again.
		return l.deadLettered(ctx, w, d, r, ReasonConstraint, err, h.attempt, ResultDeadLettered)
	}
	return step{itemFailed: err}, Outcome{Result: ResultRetried, Error: err.Error()}
}

// runItem runs the processor on item with the attempt's context actx, in
// a savepoint of w's transaction. It returns the processor's error (its
// writes rolled back) or nil (they stand), or a step saying that the
// store failed or that the item's failure lost the transaction.
func (l *Loop) runItem(actx context.Context, w *work, d Delivery, item Item) (step, error) {
	if err := w.tx.BeginItem(d.Place()); err != nil {
		return step{storeFailed: err}, nil
	}
	err := l.apply(actx, w.tx, d, item)
	if err == nil {
		if err = w.tx.EndItem(); err == nil {
			return step{}, nil
		}
		if !errors.Is(err, outbox.ErrTxLost) {
			return step{storeFailed: err}, nil
		}
		// The processor went on after a statement that ended the
		// transaction: the item failed.
		return step{itemFailed: err, txLost: true}, nil
	}
	if outbox.Classify(err).Store() {
		// The database failed under the processor (a full disk, an I/O
		// error): not the item's fault, and the transaction is lost.
		return step{storeFailed: err}, nil
	}
	if rerr := w.tx.RollbackItem(); rerr != nil {
		if errors.Is(rerr, outbox.ErrTxLost) {
			return step{itemFailed: err, txLost: true}, nil
		}
		return step{storeFailed: rerr}, nil
	}
	return step{}, err
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
