package ingest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// head is what the loop knows of a batch's first item from earlier tries.
type head struct {
	attempt int   // the try this is (1 = first)
	spent   error // set when its retries are spent: dead-letter it with this
}

// batch is a run of records and the sequence of each item.
type batch struct {
	recs []Record
	seqs []int64 // per record; 0 for epoch changes and losses
}

func (b batch) from(i int) batch { return batch{recs: b.recs[i:], seqs: b.seqs[i:]} }

// process applies and commits recs. An item failing transiently ends the
// transaction before it (the items ahead of it are committed) and is tried
// again alone after a backoff; the rest follow it.
func (l *Loop) process(ctx context.Context, recs []Record) error {
	l.applyMu.Lock()
	defer l.applyMu.Unlock()
	b := batch{recs: recs, seqs: make([]int64, len(recs))}
	for i, r := range recs {
		if r.Kind == RecordItem {
			l.seq++
			b.seqs[i] = l.seq
		}
	}
	h := head{attempt: 1}
	sched := l.cfg.Retry.backoff()
	for len(b.recs) > 0 {
		done, failed, err := l.applyAndCommit(ctx, b, h)
		if err != nil {
			return err
		}
		b = b.from(done)
		if done > 0 { // a new first item: its own tries start over
			h = head{attempt: 1}
			sched.Reset()
		}
		if failed == nil {
			continue
		}
		if h, err = l.afterFailure(ctx, b, h, failed, sched.NextBackOff()); err != nil {
			return err
		}
	}
	return nil
}

// afterFailure decides what follows a transient failure of b's first item:
// another try after wait, or its failure policy.
func (l *Loop) afterFailure(ctx context.Context, b batch, h head, failed error, wait time.Duration) (head, error) {
	r := b.recs[0]
	l.setError(failed)
	if h.attempt >= l.cfg.Retry.Attempts {
		if l.cfg.OnFailure == OnFailureStop {
			return h, l.stall(ctx, fmt.Errorf("item at %s[%d] position %d failed %d times: %w",
				l.cfg.Name, r.Partition, r.Position, h.attempt, failed))
		}
		l.log.Warn("retries spent: dead-lettering", "partition", r.Partition, "position", r.Position, "attempts", h.attempt, "err", failed)
		return head{attempt: h.attempt, spent: failed}, nil
	}
	l.log.Warn("item failed: will retry", "partition", r.Partition, "position", r.Position, "attempt", h.attempt, "wait", wait, "err", failed)
	if !sleep(ctx, wait) {
		return h, ctx.Err()
	}
	return head{attempt: h.attempt + 1}, nil
}

// applyAndCommit runs applyOnce, retrying the whole transaction when the
// store fails, and applies the completion failure policy when the retries
// are spent.
func (l *Loop) applyAndCommit(ctx context.Context, b batch, h head) (done int, failed error, err error) {
	sched := l.cfg.CommitRetry.backoff()
	for attempt := 1; ; attempt++ {
		done, failed, err = l.applyOnce(ctx, b, h)
		if err == nil {
			return done, failed, nil
		}
		if errors.Is(err, outbox.ErrFenced) {
			l.setError(err)
			return 0, nil, err // not a completion failure: this process must stop
		}
		l.setError(err)
		if attempt >= l.cfg.CommitRetry.Attempts {
			return l.completionFailed(ctx, b.recs[:max(done, 1)], err)
		}
		wait := sched.NextBackOff()
		l.log.Warn("batch transaction failed: will retry", "attempt", attempt, "wait", wait, "err", err)
		if !sleep(ctx, wait) {
			return 0, nil, ctx.Err()
		}
	}
}

// txn is one transaction's work in progress.
type txn struct {
	tx      *outbox.Tx
	cps     map[int32]outbox.Checkpoint // the checkpoints as they will be after commit
	touch   map[int32]bool
	delta   outbox.StatsDelta
	logs    []func() // run after commit
	records int      // records the transaction covers
}

// applyOnce applies b's records in one transaction, stopping before an item
// that fails transiently, and commits. It returns how many records the
// transaction covered, the transient error that stopped it (if any), and a
// store error (then nothing was committed).
func (l *Loop) applyOnce(ctx context.Context, b batch, h head) (int, error, error) {
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer tx.Rollback()
	t := &txn{tx: tx, cps: maps.Clone(l.cps), touch: map[int32]bool{}}
	if t.cps == nil {
		t.cps = map[int32]outbox.Checkpoint{}
	}
	done, failed := len(b.recs), error(nil)
	for i, r := range b.recs {
		hi := head{attempt: 1}
		if i == 0 {
			hi = h
		}
		var err error
		if failed, err = l.applyRecord(ctx, t, r, b.seqs[i], hi); err != nil {
			return i + 1, nil, err
		}
		if failed != nil {
			done = i
			break
		}
	}
	t.records = done
	if err := l.finish(ctx, t); err != nil {
		return done, nil, err
	}
	return done, failed, nil
}

// finish writes the transaction's checkpoints and stats, commits, and then
// lets the feed forget what is now stored.
func (l *Loop) finish(ctx context.Context, t *txn) error {
	ends := l.feed.Ends()
	var through []outbox.Checkpoint
	for p := range t.touch {
		c := t.cps[p]
		c.Partition, c.End = p, ends[p]
		t.cps[p] = c
		if err := t.tx.SetPosition(ctx, l.cfg.Name, c); err != nil {
			return err
		}
		through = append(through, c)
	}
	if t.delta.Applied > 0 {
		// The batch's items take effect together, at this commit.
		t.delta.LastAppliedAt = l.store.Now()
	}
	if err := t.tx.AddStats(ctx, l.cfg.Name, t.delta); err != nil {
		return err
	}
	started := time.Now()
	if err := t.tx.Commit(); err != nil {
		return err
	}
	if l.cfg.OnBatch != nil {
		l.cfg.OnBatch(t.records, time.Since(started))
	}
	l.cps = t.cps
	for _, f := range t.logs {
		f()
	}
	l.setError(nil)
	l.setState(l.stateAfter(ends))
	if len(through) > 0 {
		if err := l.feed.Commit(ctx, through); err != nil {
			l.log.Warn("feed commit failed (the store's position stands)", "err", err)
		}
	}
	return nil
}

func (l *Loop) stateAfter(ends map[int32]int64) string {
	for p, end := range ends {
		if l.cps[p].Position < end {
			return StateRunning
		}
	}
	return StateCaughtUp
}

// applyRecord handles one record inside t. It returns the transient error
// of an item that must be retried (nothing of it is kept), or a store error.
func (l *Loop) applyRecord(ctx context.Context, t *txn, r Record, seq int64, h head) (error, error) {
	switch r.Kind {
	case RecordEpoch:
		l.changeEpoch(t, r.Partition, r.Epoch, r.Position)
		return nil, nil
	case RecordLoss:
		return nil, l.recordLoss(ctx, t, r)
	}
	cp := t.cps[r.Partition]
	d := Delivery{Feed: l.cfg.Name, Partition: r.Partition, Topic: r.Topic, Sequence: seq, Epoch: r.Epoch, Position: r.Position, Attempt: h.attempt}
	if !l.cfg.DisableGuard && d.AlreadyApplied(cp.Epoch, cp.Position) {
		t.delta.ReplaysSkipped++
		return nil, nil
	}
	if cp.Epoch != r.Epoch {
		l.changeEpoch(t, r.Partition, r.Epoch, 0)
	}
	failed, err := l.applyItem(ctx, t, d, r, h)
	if err != nil || failed != nil {
		return failed, err
	}
	t.cps[r.Partition] = outbox.Checkpoint{Partition: r.Partition, Epoch: r.Epoch, Position: r.Position}
	t.touch[r.Partition] = true
	return nil, nil
}

// applyItem runs the processor in a savepoint, or dead-letters the item.
func (l *Loop) applyItem(ctx context.Context, t *txn, d Delivery, r Record, h head) (error, error) {
	switch {
	case r.BadReason != "":
		return nil, l.deadLetter(ctx, t, d, r, r.BadReason, r.BadErr, 1)
	case h.spent != nil:
		return nil, l.deadLetter(ctx, t, d, r, reasonOf(h.spent, ReasonRetriesSpent), h.spent, h.attempt)
	}
	if h.attempt > 1 {
		t.delta.Retries++
	}
	if err := t.tx.BeginItem(d.Place()); err != nil {
		return nil, err
	}
	err := l.apply(l.attemptContext(ctx), t.tx, d, r.Item)
	if err == nil {
		t.delta.Applied++
		return nil, t.tx.EndItem()
	}
	if rerr := t.tx.RollbackItem(); rerr != nil {
		return nil, rerr
	}
	if p, ok := IsPermanent(err); ok {
		return nil, l.deadLetter(ctx, t, d, r, p.Reason, p.Err, max(h.attempt, p.Attempts))
	}
	return err, nil
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
	now := time.Now()
	a := &l.attempt
	if a.ctx != nil && a.ctx.Err() == nil && now.Sub(a.at) <= attemptReuse(timeout) {
		return a.ctx
	}
	a.stop()
	a.ctx, a.cancel = l.newAttemptContext(ctx)
	a.at = now
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
func (l *Loop) deadLetter(ctx context.Context, t *txn, d Delivery, r Record, reason string, cause error, attempts int) error {
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
	}
	id, err := t.tx.DeadLetter(ctx, outbox.DeadLetter{
		Feed: d.Feed, Partition: d.Partition, Epoch: d.Epoch, Position: d.Position, Sequence: d.Sequence,
		Attempts: attempts, Reason: reason, Error: msg,
		Key: r.Item.Key, Payload: r.Item.Value, Headers: outbox.EncodeHeaders(r.Item.Headers),
	})
	if err != nil {
		return err
	}
	own := deadLetterHeaders{reason: reason, err: msg, attempts: attempts, id: id}
	out := own.output(d.Place(), l.cfg.DeadLetterTopic, r.Item, l.cfg.MaxMessageBytes)
	t.tx.SetPlace(d.Place())
	if err := t.tx.Emit(ctx, out); err != nil {
		return err
	}
	t.delta.DeadLettered++
	t.cps[r.Partition] = outbox.Checkpoint{Partition: r.Partition, Epoch: r.Epoch, Position: r.Position}
	t.touch[r.Partition] = true
	t.logs = append(t.logs, func() {
		l.log.Warn("dead-lettered", "partition", d.Partition, "position", d.Position, "reason", reason, "err", cutText(msg, maxCutError))
	})
	return nil
}

func (l *Loop) changeEpoch(t *txn, p int32, epoch string, pos int64) {
	old := t.cps[p]
	t.cps[p] = outbox.Checkpoint{Partition: p, Epoch: epoch, Position: pos}
	t.touch[p] = true
	if old.Epoch == epoch {
		return
	}
	if old.Epoch != "" {
		t.delta.EpochChanges++
	}
	t.logs = append(t.logs, func() {
		l.log.Info("new epoch: every item of it is applied", "partition", p, "epoch", epoch, "previous", old.Epoch, "from", pos)
	})
}

func (l *Loop) recordLoss(ctx context.Context, t *txn, r Record) error {
	err := t.tx.RecordLoss(ctx, outbox.Loss{
		Feed: l.cfg.Name, Partition: r.Partition, Reason: r.Reason, Epoch: r.Epoch, From: r.From, To: r.To,
	})
	if err != nil {
		return err
	}
	t.logs = append(t.logs, func() {
		l.log.Error("input lost before it was read: the feed is no longer lossless",
			"partition", r.Partition, "epoch", r.Epoch, "from", r.From, "to", r.To, "reason", r.Reason)
	})
	return nil
}

// completionFailed applies the completion failure policy to recs, whose
// transaction kept failing with cause.
func (l *Loop) completionFailed(ctx context.Context, recs []Record, cause error) (int, error, error) {
	if l.cfg.OnCompletionFailure == OnCompletionStop {
		return 0, nil, l.stall(ctx, fmt.Errorf("completion failure: %w", cause))
	}
	if err := l.skip(ctx, recs, cause); err != nil {
		return 0, nil, l.stall(ctx, fmt.Errorf("completion failure %v, and skipping it failed: %w", cause, err))
	}
	return len(recs), nil, nil
}

// skip moves the feed past recs without their effects, counting a
// completion failure and recording the loss of each partition's range.
func (l *Loop) skip(ctx context.Context, recs []Record, cause error) error {
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	t := &txn{tx: tx, cps: maps.Clone(l.cps), touch: map[int32]bool{}}
	if t.cps == nil {
		t.cps = map[int32]outbox.Checkpoint{}
	}
	from := map[int32]int64{}
	for _, r := range recs {
		if r.Kind == RecordLoss {
			if err := l.recordLoss(ctx, t, r); err != nil {
				return err
			}
			continue
		}
		p := r.Partition
		if _, ok := from[p]; !ok {
			from[p] = t.cps[p].Position
			if t.cps[p].Epoch != r.Epoch {
				from[p] = 0
			}
		}
		t.cps[p] = outbox.Checkpoint{Partition: p, Epoch: r.Epoch, Position: r.Position}
		t.touch[p] = true
	}
	for p := range t.touch {
		c := t.cps[p]
		loss := outbox.Loss{Feed: l.cfg.Name, Partition: p, Epoch: c.Epoch, From: from[p], To: c.Position,
			Reason: "completion failure skipped: " + cause.Error()}
		if err := tx.RecordLoss(ctx, loss); err != nil {
			return err
		}
	}
	t.delta.CompletionFailures = 1
	t.records = len(recs)
	l.log.Error("completion failure: skipping the batch, the feed is no longer lossless", "records", len(recs), "err", cause)
	return l.finish(ctx, t)
}

// stall stops the feed under a `stop` policy, keeping the reason.
func (l *Loop) stall(ctx context.Context, cause error) error {
	l.setError(cause)
	l.setState(StateStalled)
	l.log.Error("feed stalled", "err", cause)
	if err := l.store.SetLastError(context.WithoutCancel(ctx), l.cfg.Name, cause.Error()); err != nil {
		l.log.Error("storing the stall reason", "err", err)
	}
	return fmt.Errorf("%w: %s: %w", ErrStalled, l.cfg.Name, cause)
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
