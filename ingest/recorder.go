package ingest

import (
	"context"
	"errors"
	"strings"

	"github.com/outboxd/outboxd/outbox"
)

// Recorder keeps what a loop handles, for a replay (see ingest/recording).
// The loop calls it on its own goroutine, so calls never overlap, in this
// order per transaction: Begin, then Handled for each record the
// transaction takes in (followed by Outcome for an item),
// then Prepare just before the store's COMMIT and Committed once it
// succeeded. What was handed over since the last Committed belongs to a
// transaction that did not commit when Begin comes again.
//
// A Recorder never fails the loop: it has no errors to return, and keeps
// (and reports) its own. It must not keep a Record's or Item's slices past
// the call: the feed may reuse them.
type Recorder interface {
	// Start is called once, when the loop has read its committed
	// checkpoints and before the feed opens: from is where the run starts.
	Start(ctx context.Context, from map[int32]outbox.Checkpoint)
	// Begin starts a transaction.
	Begin()
	// Handled is a record the transaction took in: an item with the
	// delivery it is tried with, an epoch change or a loss (d is zero).
	// A completion failure skip hands over each item it skips (its
	// Sequence and Attempt 0, with the Outcome ResultSkipped) and then
	// the loss it records for them, as a RecordLoss.
	Handled(r Record, d Delivery)
	// Outcome is what came of the item last handled.
	Outcome(o Outcome)
	// Prepare is called right before the store's COMMIT, with the
	// checkpoints of every partition as they will be once it commits.
	Prepare(cps map[int32]outbox.Checkpoint)
	// Committed says the transaction committed.
	Committed()
	// Close ends the recording; the loop calls it when Run returns.
	Close()
}

// Result is what came of one try of an item.
type Result uint8

// Results of a try. The values are stored in recordings: never renumber.
const (
	// ResultApplied: the processor applied the item; its effects commit.
	ResultApplied Result = 1
	// ResultDeadLettered: the item is a dead letter, by the processor's
	// verdict (a permanent error, a broken constraint) or the feed's (an
	// item it could not read whole, see Record.BadReason).
	ResultDeadLettered Result = 2
	// ResultSpent: the item is a dead letter by the loop's decision, its
	// tries spent (or the one item a failing commit was cut down to); the
	// processor was not called.
	ResultSpent Result = 3
	// ResultRetried: the try failed transiently; the item is tried again.
	ResultRetried Result = 4
	// ResultReplaySkipped: the item was applied already (the guard).
	ResultReplaySkipped Result = 5
	// ResultRequeued: a dead letter applied again (Loop.Requeue).
	ResultRequeued Result = 6
	// ResultSkipped: a completion failure skipped the item: its effects
	// are not kept, and a loss says so.
	ResultSkipped Result = 7
)

// String names the result as recordings and replays print it.
func (r Result) String() string {
	switch r {
	case ResultApplied:
		return "applied"
	case ResultDeadLettered:
		return "dead-lettered"
	case ResultSpent:
		return "dead-lettered-spent"
	case ResultRetried:
		return "retried"
	case ResultReplaySkipped:
		return "replay-skipped"
	case ResultRequeued:
		return "requeued"
	case ResultSkipped:
		return "skipped"
	}
	return "unknown"
}

// Outcome is the outcome of one try of an item.
type Outcome struct {
	Result Result
	// Reason and Error are a dead letter's reason and error text, or a
	// retried try's error.
	Reason, Error string
	// Attempts is the attempts a dead letter counts.
	Attempts int
	// DeadLetterID names the dead letter a requeue applied.
	DeadLetterID int64
}

// Replayed carries the recorded delivery of an item that a replay feeds
// back to a loop: the loop delivers the item with this sequence and, for
// its first try, this attempt, rather than its own count. SpentReason and
// SpentError, when set, say the recorded run dead-lettered the item after
// its tries were spent without calling the processor: the replay does the
// same (the recorded transient failures were the environment's, which a
// replay does not have).
type Replayed struct {
	Sequence    int64
	Attempt     int
	SpentReason string
	SpentError  string
}

// replayedTries is the first try of r: the recorded one for a replayed
// record, the first otherwise; spent is set when the recorded run
// dead-lettered it with its tries spent.
func replayedTries(r Record) (attempt int, spent error) {
	rp := r.Replayed
	if rp == nil {
		return 1, nil
	}
	if rp.SpentReason != "" {
		spent = spentError(rp.SpentReason, rp.SpentError)
	}
	return max(rp.Attempt, 1), spent
}

// spentError rebuilds the cause of a recorded spent dead letter so that
// the dead letter made again carries the same reason and error text: a
// permanent error's text starts with its reason (see PermanentError).
func spentError(reason, msg string) error {
	if rest, ok := strings.CutPrefix(msg, reason+": "); ok && reason != ReasonRetriesSpent {
		return Permanent(reason, errors.New(rest))
	}
	return errors.New(msg)
}

// observer is what the loop tells of its work, on its goroutine: a run
// starting from checkpoints, each transaction begun, each record handled
// with its outcome (zero when the transaction fails before one), the
// commit (commit runs the store's COMMIT and its error is returned), and
// the run's end. Behind it is the recording (Config.Recorder) or nothing.
type observer interface {
	started(ctx context.Context, from map[int32]outbox.Checkpoint)
	begun()
	handled(r Record, d Delivery, o Outcome)
	commit(cps map[int32]outbox.Checkpoint, commit func() error) error
	closed()
}

// noObserver is the observer of a loop not recorded.
type noObserver struct{}

func (noObserver) started(context.Context, map[int32]outbox.Checkpoint) {}
func (noObserver) begun()                                               {}
func (noObserver) handled(Record, Delivery, Outcome)                    {}
func (noObserver) closed()                                              {}

func (noObserver) commit(_ map[int32]outbox.Checkpoint, commit func() error) error { return commit() }

// recording tells a Recorder, in the order its contract says.
type recording struct{ rec Recorder }

func (o recording) started(ctx context.Context, from map[int32]outbox.Checkpoint) {
	o.rec.Start(ctx, from)
}

func (o recording) begun() { o.rec.Begin() }

func (o recording) handled(r Record, d Delivery, out Outcome) {
	o.rec.Handled(r, d)
	if out.Result != 0 {
		o.rec.Outcome(out)
	}
}

// commit hands the checkpoints over right before the COMMIT and says it
// committed once it did.
func (o recording) commit(cps map[int32]outbox.Checkpoint, commit func() error) error {
	o.rec.Prepare(cps)
	if err := commit(); err != nil {
		return err
	}
	o.rec.Committed()
	return nil
}

func (o recording) closed() { o.rec.Close() }

// deadLettered dead-letters the item; its outcome's result says whose
// decision it was.
func (l *Loop) deadLettered(ctx context.Context, w *work, d Delivery, r Record, reason string, cause error, attempts int, res Result) (result, Outcome) {
	if err := l.deadLetter(ctx, w, d, r, reason, cause, attempts); err != nil {
		return result{storeFailed: err}, Outcome{}
	}
	return result{}, Outcome{Result: res, Reason: reason, Error: causeText(cause), Attempts: attempts}
}

// causeText is a dead letter's error text, as deadLetter stores it.
func causeText(cause error) string {
	if cause == nil {
		return "unknown error"
	}
	return cause.Error()
}
