package recording

import (
	"context"
	"maps"
	"sync"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// tally is the replay loop's recorder: it counts what the replay's
// committed transactions did, and compares each item's outcome with the
// recorded one. Items come out of the loop in the order the feed handed
// them over, so the recorded outcomes wait in a queue.
type tally struct {
	sum  *Summary
	want []expected // handed over, outcome not committed yet
	head int

	item    ingest.Delivery // the item last handled
	pending []done          // of the transaction in progress
	ordinal int64

	keepPlaces bool // in sum.Places
}

// expected is an item handed over and its recorded outcome.
type expected struct {
	seq       int64
	partition int32
	epoch     string
	position  int64
	outcome   ingest.Outcome
}

// done is something the transaction in progress did.
type done struct {
	kind    ingest.RecordKind
	d       ingest.Delivery
	outcome ingest.Outcome
}

var _ ingest.Recorder = (*tally)(nil)

// expect queues the recorded outcome of an item handed over.
func (t *tally) expect(seq int64, r ingest.Record, o ingest.Outcome) {
	t.want = append(t.want, expected{seq: seq, partition: r.Partition, epoch: r.Epoch, position: r.Position, outcome: o})
}

// notCommitted takes the expectation of an item (a requeue) whose replay
// committed nothing, why saying what came of it instead.
func (t *tally) notCommitted(why string) {
	if w, ok := t.pop(); ok {
		t.differs(w, why)
	}
}

func (t *tally) pop() (expected, bool) {
	if t.head >= len(t.want) {
		return expected{}, false
	}
	w := t.want[t.head]
	t.head++
	if t.head > 1024 && t.head*2 > len(t.want) { // keep the queue small
		t.want = append(t.want[:0], t.want[t.head:]...)
		t.head = 0
	}
	return w, true
}

func (t *tally) Start(context.Context, map[int32]outbox.Checkpoint) {}
func (t *tally) Prepare(map[int32]outbox.Checkpoint)                {}
func (t *tally) Close()                                             {}

// Begin forgets an uncommitted transaction.
func (t *tally) Begin() { t.pending = t.pending[:0] }

func (t *tally) Handled(r ingest.Record, d ingest.Delivery) {
	if r.Kind != ingest.RecordItem {
		t.pending = append(t.pending, done{kind: r.Kind})
		return
	}
	t.item = d
}

func (t *tally) Outcome(o ingest.Outcome) {
	t.pending = append(t.pending, done{kind: ingest.RecordItem, d: t.item, outcome: o})
}

// Committed counts the transaction.
func (t *tally) Committed() {
	for _, x := range t.pending {
		switch x.kind {
		case ingest.RecordEpoch:
			t.sum.EpochChanges++
			continue
		case ingest.RecordLoss:
			t.sum.Losses++
			continue
		}
		if x.outcome.Result == ingest.ResultRetried {
			t.sum.Retried++
			continue
		}
		t.final(x.d, x.outcome)
	}
	t.pending = t.pending[:0]
}

// final counts an item's outcome and compares it with the recorded one.
func (t *tally) final(d ingest.Delivery, o ingest.Outcome) {
	s := t.sum
	s.Items++
	switch o.Result {
	case ingest.ResultApplied:
		s.Applied++
	case ingest.ResultReplaySkipped:
		s.ReplaysSkipped++
	case ingest.ResultDeadLettered, ingest.ResultSpent:
		s.DeadLettered++
	case ingest.ResultRequeued:
		s.Requeued++
	}
	if t.keepPlaces && o.Result != ingest.ResultReplaySkipped {
		s.Places = append(s.Places, Place{Partition: d.Partition, Epoch: d.Epoch, Position: d.Position, Ordinal: t.ordinal})
		t.ordinal++
	}
	w, ok := t.pop()
	if !ok {
		return
	}
	if decision(w.outcome) != decision(o) {
		t.differs(w, decision(o))
	}
}

func (t *tally) differs(w expected, got string) {
	t.sum.DecisionsDiffering++
	if t.sum.FirstDiffering == nil {
		t.sum.FirstDiffering = &Decision{Sequence: w.seq, Partition: w.partition, Epoch: w.epoch, Position: w.position,
			Recorded: decision(w.outcome), Replayed: got}
	}
}

// decision is what an outcome decided: applied, skipped as a replay, or
// dead-lettered with its reason (by the processor or by the loop alike).
func decision(o ingest.Outcome) string {
	switch o.Result {
	case ingest.ResultDeadLettered, ingest.ResultSpent:
		return "dead-lettered " + o.Reason
	}
	return o.Result.String()
}

// ends is a feed's last positions, safe for concurrent use.
type ends struct {
	mu sync.Mutex
	m  map[int32]int64
}

func (e *ends) set(p int32, pos int64) {
	e.mu.Lock()
	e.m[p] = pos
	e.mu.Unlock()
}

func (e *ends) get() map[int32]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.m)
}
