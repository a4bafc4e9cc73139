package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox"
)

// ErrNotRunning is returned by Requeue when the feed's loop is not running
// (not started yet, or Run has returned): the loop applies requeues, so
// nothing is applied.
var ErrNotRunning = errors.New("the feed's loop is not running: a requeue is applied by it")

// requeueTakeWithin bounds how long a requeue waits for the loop to take
// it, below the HTTP API's write timeout: a loop that takes longer (its
// feed still opening, a long transaction) answers with an error, nothing
// applied.
const requeueTakeWithin = 10 * time.Second

// maxQueuedRequeues bounds the requeues waiting for the loop; one more is
// refused at once.
const maxQueuedRequeues = 64

// Requeue feeds dead letter id of this feed back through the processor as a
// new delivery (same place, next attempt), in one transaction that also
// marks it requeued: a dead letter is requeued at most once, however often
// it is asked. It returns false, changing nothing, when it was requeued
// already. If the processor fails again, nothing changes and the error is
// returned. Safe for concurrent use with Run (see RequeueWith).
func (l *Loop) Requeue(ctx context.Context, id int64) (bool, error) {
	return l.RequeueWith(ctx, id, outbox.Requeue{})
}

// RequeueWith is Requeue recording who asked (r.By, r.Note) and, when
// r.Payload is not nil, applying it instead of the stored payload (an
// operator's edit of a malformed item; the dead letter keeps both). A
// payload equal to the stored one is no edit. A discarded dead letter is
// not requeued: false, changing nothing.
//
// The loop's goroutine applies the requeue, in a transaction of its own
// between two of its batches or while it waits (a stall, a retry's
// backoff, the backlog's bound, a poll of the feed), and handles its
// transaction as its own: a store failure that ends the feed ends it (the
// requeue gets that error), a passing one is retried on the
// Config.CommitRetry schedule, a lasting one (a full disk) is returned at
// once; an item whose failure lost the transaction failed again. Only a
// running loop applies requeues: before Run and after it returns,
// RequeueWith returns ErrNotRunning at once. A requeue the loop has not
// taken within 10 seconds (its feed still opening, a long transaction) or
// before ctx ends is dropped, nothing applied, and an error says so; once
// taken, it runs to its end (its statements under ctx). A feed may call
// RequeueWith from its Poll, with Poll's context, when Poll was given no
// records: the loop has nothing in hand then, and applies it at once.
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
	q := &requeueReq{ctx: ctx, id: id, dl: dl, r: r, headers: hs, done: make(chan requeueResult, 1)}
	if owner, _ := ctx.Value(pollKey{}).(*Loop); owner == l {
		res := l.serveRequeue(q) // the loop's own goroutine, in its feed's Poll
		return res.applied, res.err
	}
	if err := l.reqs.put(q); err != nil {
		return false, fmt.Errorf("requeue dead letter %d: %w", id, err)
	}
	return q.await(l)
}

// requeueReq is a requeue waiting for the loop, and its answer.
type requeueReq struct {
	ctx     context.Context // the caller's: the transaction's statements run under it
	id      int64
	dl      outbox.DeadLetter
	r       outbox.Requeue
	headers []outbox.Header
	done    chan requeueResult // 1-buffered: the loop never waits on it
}

type requeueResult struct {
	applied bool
	err     error
}

// await waits for q's answer, or drops q when the loop does not take it
// in time.
func (q *requeueReq) await(l *Loop) (bool, error) {
	t := time.NewTimer(requeueTakeWithin)
	defer t.Stop()
	var why error
	select {
	case res := <-q.done:
		return res.applied, res.err
	case <-q.ctx.Done():
		why = q.ctx.Err()
	case <-t.C:
		st, _ := l.State()
		why = fmt.Errorf("the feed's loop did not take it within %v (state %s): nothing applied, try again", requeueTakeWithin, st)
	}
	if !l.reqs.drop(q) {
		res := <-q.done // taken meanwhile: it runs to its end
		return res.applied, res.err
	}
	return false, fmt.Errorf("requeue dead letter %d: %w", q.id, why)
}

// item is the item the requeue applies: the stored one, or the edit.
func (q *requeueReq) item() Item {
	it := Item{Key: q.dl.Key, Value: q.dl.Payload, Headers: q.headers}
	if q.r.Payload != nil {
		it.Value = q.r.Payload
	}
	return it
}

// pollKey marks the context a loop hands its feed's Poll (see RequeueWith).
type pollKey struct{}

// errRequeueWaiting cancels a poll so that the loop serves a requeue.
var errRequeueWaiting = errors.New("a requeue is waiting")

// requests is the queue of requeues for the loop's goroutine.
type requests struct {
	mu      sync.Mutex
	serving bool // Run is running
	queue   []*requeueReq
	wake    context.CancelCauseFunc // cancels the poll the loop waits in
	signal  chan struct{}           // 1-buffered: a requeue was queued
}

// open starts taking requeues.
func (q *requests) open() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.serving = true
	if q.signal == nil {
		q.signal = make(chan struct{}, 1)
	}
}

// close stops taking requeues and answers those waiting with err.
func (q *requests) close(err error) {
	q.mu.Lock()
	waiting := q.queue
	q.queue, q.serving = nil, false
	q.mu.Unlock()
	for _, r := range waiting {
		r.done <- requeueResult{err: fmt.Errorf("requeue dead letter %d: %w", r.id, err)}
	}
}

func (q *requests) put(r *requeueReq) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case !q.serving:
		return ErrNotRunning
	case len(q.queue) >= maxQueuedRequeues:
		return fmt.Errorf("%d requeues wait for the feed's loop already: nothing applied, try again", len(q.queue))
	}
	q.queue = append(q.queue, r)
	if q.wake != nil {
		q.wake(errRequeueWaiting)
	}
	select {
	case q.signal <- struct{}{}:
	default:
	}
	return nil
}

// take empties the queue.
func (q *requests) take() []*requeueReq {
	q.mu.Lock()
	defer q.mu.Unlock()
	rs := q.queue
	q.queue = nil
	return rs
}

// drop removes r, not taken yet; false when it was taken.
func (q *requests) drop(r *requeueReq) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, w := range q.queue {
		if w == r {
			q.queue = append(q.queue[:i], q.queue[i+1:]...)
			return true
		}
	}
	return false
}

// polling makes a requeue put from now on cancel the poll with wake (nil:
// none); false when one waits already.
func (q *requests) polling(wake context.CancelCauseFunc) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.wake = wake
	return wake == nil || len(q.queue) == 0
}

// pollContext is the context of the polls that collect a batch: a requeue
// put meanwhile cancels it (see woken), and it carries the loop (see
// RequeueWith). done releases it.
func (l *Loop) pollContext(ctx context.Context) (pctx context.Context, done func()) {
	c, cancel := context.WithCancelCause(ctx)
	if !l.reqs.polling(cancel) {
		cancel(errRequeueWaiting)
	}
	return context.WithValue(c, pollKey{}, l), func() {
		l.reqs.polling(nil)
		cancel(nil)
	}
}

// woken reports whether pctx ended for a requeue, ctx still going.
func woken(ctx, pctx context.Context) bool {
	return ctx.Err() == nil && errors.Is(context.Cause(pctx), errRequeueWaiting)
}

// serveRequeues applies the requeues waiting. It returns the error that
// ends the feed when one of them met it (the rest get it too).
func (l *Loop) serveRequeues() error {
	for _, q := range l.reqs.take() {
		if l.fatal != nil {
			q.done <- requeueResult{err: fmt.Errorf("requeue dead letter %d: %w", q.id, l.fatal)}
			continue
		}
		q.done <- l.serveRequeue(q)
	}
	return l.fatal
}

// wait waits d, applying the requeues that come meanwhile. It returns nil
// once d passed, ctx's error when ctx ends first, or the error that ends
// the feed, met by a requeue.
func (l *Loop) wait(ctx context.Context, d time.Duration) error {
	if err := l.serveRequeues(); err != nil {
		return err
	}
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-l.reqs.signal:
			if err := l.serveRequeues(); err != nil {
				return err
			}
		}
	}
}

// serveRequeue applies q on the loop's goroutine, in a transaction of its
// own made by transact, retried as Config.CommitRetry says while the store
// fails for a passing reason.
func (l *Loop) serveRequeue(q *requeueReq) requeueResult {
	l.seq++
	d := Delivery{Feed: l.cfg.Name, Partition: q.dl.Partition, Sequence: l.seq, Epoch: q.dl.Epoch,
		Position: q.dl.Position, Attempt: q.dl.Attempts + 1}
	rec := Record{Kind: RecordItem, Partition: d.Partition, Epoch: d.Epoch, Position: d.Position, Item: q.item()}
	b := batch{recs: []Record{rec}, seqs: []int64{d.Sequence}, requeue: q}
	commitWait := l.cfg.CommitRetry.backoff()
	for try := 1; ; try++ {
		out := l.transact(q.ctx, b, d.Attempt, nil, false)
		switch {
		case out.txLost || out.itemFailed != nil:
			return requeueResult{err: fmt.Errorf("requeue dead letter %d: the processor failed again: %w", q.id, out.itemFailed)}
		case out.storeFailed == nil && out.committed == 0:
			return requeueResult{} // requeued or discarded meanwhile
		case out.storeFailed == nil:
			l.log.Info("dead letter requeued and applied", "id", q.id, "position", d.Position)
			return requeueResult{applied: true}
		}
		err, class := out.storeFailed, outbox.Classify(out.storeFailed)
		switch {
		case errors.Is(err, outbox.ErrPartitionFenced):
			// The group moved the partition to another server: this one
			// must not apply it, but its other partitions go on.
			return requeueResult{err: fmt.Errorf("requeue dead letter %d: partition %d is another server's now: "+
				"requeue it on that server: %w", q.id, d.Partition, err)}
		case class.Fatal():
			l.fatal = fmt.Errorf("feed %s: %s: %w", l.cfg.Name, class, err)
			return requeueResult{err: fmt.Errorf("requeue dead letter %d: %w", q.id, l.fatal)}
		case class == outbox.ClassConstraint:
			return requeueResult{err: fmt.Errorf("requeue dead letter %d: the processor's writes break a constraint: %w", q.id, err)}
		case class.Lasting() || try >= l.cfg.CommitRetry.Attempts:
			return requeueResult{err: fmt.Errorf("requeue dead letter %d: %s: %w", q.id, class, err)}
		}
		wait := commitWait.NextBackOff()
		l.log.Warn("requeue transaction failed: will retry", "id", q.id, "attempt", try, "wait", wait, "class", class, "err", err)
		if clock.Sleep(q.ctx, wait) != nil {
			return requeueResult{err: fmt.Errorf("requeue dead letter %d: %w", q.id, q.ctx.Err())}
		}
	}
}

// applyRequeue is transact's work for a requeue (b.requeue): it marks the
// dead letter requeued and applies its item, and commits; nothing commits
// when the dead letter is resolved already or the processor fails.
func (l *Loop) applyRequeue(ctx context.Context, w *work, b batch) result {
	q, r := b.requeue, b.recs[0]
	ok, err := w.tx.MarkRequeuedBy(ctx, l.cfg.Name, q.id, q.r)
	if err != nil {
		return result{storeFailed: err}
	}
	if !ok {
		return result{}
	}
	d := Delivery{Feed: l.cfg.Name, Partition: r.Partition, Sequence: b.seqs[0], Epoch: r.Epoch,
		Position: r.Position, Attempt: q.dl.Attempts + 1}
	actx, cancel := l.newAttemptContext(ctx)
	defer cancel()
	st, perr := l.runItem(actx, w, d, r.Item)
	if st != (result{}) || perr != nil {
		l.obs.handled(r, d, Outcome{}) // the transaction is abandoned
	}
	switch {
	case st.txLost:
		return result{itemFailed: st.itemFailed, txLost: true, reached: 1}
	case st.storeFailed != nil:
		return result{storeFailed: st.storeFailed, reached: 1}
	case perr != nil:
		return result{itemFailed: perr}
	}
	w.delta.Applied++
	l.obs.handled(r, d, Outcome{Result: ResultRequeued, DeadLetterID: q.id})
	w.requeue = true
	if err := l.finish(ctx, w); err != nil {
		return result{storeFailed: err, reached: 1}
	}
	return result{committed: 1}
}

// Processor is the processor's name, as configured.
func (l *Loop) Processor() string { return l.cfg.Processor }
