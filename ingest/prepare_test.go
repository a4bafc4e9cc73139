package ingest_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/testseam"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// preparing is a counter that is also a Preparer: it keeps what each
// Prepare was shown, checks that Apply runs in the transaction Prepare was
// shown last, and fails its first failFirst calls.
type preparing struct {
	*counter
	mu        sync.Mutex
	shown     [][]string // per call: the items' values
	tx        *outbox.Tx // the transaction of the last Prepare
	wrongTx   int        // Apply calls in another transaction
	failFirst int
}

func (p *preparing) Prepare(ctx context.Context, tx *outbox.Tx, feed string, items []ingest.Item) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if feed != "f" {
		return errors.New("prepare: feed " + feed + ", want f")
	}
	var vs []string
	for _, it := range items {
		vs = append(vs, string(it.Value))
	}
	p.shown, p.tx = append(p.shown, vs), tx
	if p.failFirst > 0 {
		p.failFirst--
		return errors.New("the read failed")
	}
	return nil
}

func (p *preparing) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	p.mu.Lock()
	if tx != p.tx {
		p.wrongTx++
	}
	p.mu.Unlock()
	return p.counter.Apply(ctx, tx, d, item)
}

// all is every value shown, call after call.
func (p *preparing) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var vs []string
	for _, s := range p.shown {
		vs = append(vs, s...)
	}
	return vs
}

func TestLoop_Prepare(t *testing.T) {
	t.Run("ShownTheItemsToApply", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := &preparing{counter: newCounter()}
		f := newMemFeed("e1", "a", "b", "c")
		_, stop := running(t, s, f, p, testConfig())
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		stop()
		if got, want := p.all(), []string{"a", "b", "c"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("shown %q, want %q", got, want)
		}

		// The next run has b and c again (the guard skips them), a bad
		// record of the feed, and an item the processor finds bad: it is
		// shown, as Apply is.
		cfg := testConfig()
		p2 := &preparing{counter: newCounter()}
		mf2 := newMemFeed("e1", "a", "b", "c", "d")
		f2 := testseam.Rewound(mf2, map[int32]int64{0: 1})
		mf2.add(ingest.Record{Kind: ingest.RecordItem, Epoch: "e1", Position: 5, Item: ingest.Item{Value: []byte("too long")},
			BadReason: ingest.ReasonTooLong, BadErr: errors.New("line too long")})
		mf2.append("e1", "bad-e", "f")
		_, stop = running(t, s, f2, p2, cfg)
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 7))
		stop()
		if got, want := p2.all(), []string{"d", "bad-e", "f"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("shown %q, want %q", got, want)
		}
		if p.wrongTx+p2.wrongTx != 0 {
			t.Fatalf("%d items applied outside the transaction Prepare was shown", p.wrongTx+p2.wrongTx)
		}
		want := map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "f": 1}
		if got := counts(t, s); !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		equal(t, "deadLettered", stats(t, s).DeadLettered, 2)
	})

	t.Run("ErrIsTheTransactions", func(t *testing.T) {
		// A failed Prepare ends its transaction as a store failure: the
		// batch is tried again whole, and every item is applied once.
		s := outboxtest.TempStore(t)
		p := &preparing{counter: newCounter(), failFirst: 2}
		f := newMemFeed("e1", "a", "b", "c")
		_, stop := running(t, s, f, p, testConfig())
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		stop()
		want := map[string]int{"a": 1, "b": 1, "c": 1}
		if got := counts(t, s); !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		rows := outboxRows(t, s)
		if len(rows) != 3 {
			t.Fatalf("outbox rows %+v, want one per item", rows)
		}
		shown := p.all()
		if len(shown) < 9 || !reflect.DeepEqual(shown[:9], []string{"a", "b", "c", "a", "b", "c", "a", "b", "c"}) {
			t.Fatalf("shown %q, want a, b, c three times (two failed reads, then the one that commits)", shown)
		}
		if p.wrongTx != 0 {
			t.Fatalf("%d items applied outside the transaction Prepare was shown", p.wrongTx)
		}
	})
}
