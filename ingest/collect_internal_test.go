package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// readyFeed is a feed whose records are all ready at once: ready of them,
// then none (Poll then waits for ctx), or without end when ready is -1.
// It counts its polls.
type readyFeed struct {
	ready   int
	next    int64
	polls   int
	waiting int // polls that found nothing and waited
	value   []byte
}

func (f *readyFeed) Kind() string                                            { return KindFile }
func (f *readyFeed) Source() string                                          { return "ready" }
func (f *readyFeed) Open(context.Context, map[int32]outbox.Checkpoint) error { return nil }
func (f *readyFeed) Commit(context.Context, []outbox.Checkpoint) error       { return nil }
func (f *readyFeed) Ends() map[int32]int64                                   { return map[int32]int64{0: f.next} }
func (f *readyFeed) Close() error                                            { return nil }
func (f *readyFeed) MaxItemBytes() int                                       { return 1 << 20 }

func (f *readyFeed) Poll(ctx context.Context, buf []Record, limit int) ([]Record, error) {
	f.polls++
	n := limit
	if f.ready >= 0 {
		n = min(n, f.ready)
		f.ready -= n
	}
	if n == 0 {
		f.waiting++
		<-ctx.Done()
		return buf, ctx.Err()
	}
	for range n {
		f.next += int64(len(f.value))
		buf = append(buf, Record{Kind: RecordItem, Epoch: "e", Position: f.next, Item: Item{Value: f.value}})
	}
	return buf, nil
}

func newCollectLoop(tb testing.TB, feed Feed, wait time.Duration) *Loop {
	tb.Helper()
	cfg := DefaultConfig("collect")
	cfg.BatchWait = wait
	l, err := NewLoop(nil, feed, nil, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// TestCollect_ClosesWhenNothingMore: a batch takes every record the feed
// has ready, over as many polls as its byte budget needs, and closes when
// the feed has nothing more, not BatchWait (an hour here) later.
func TestCollect_ClosesWhenNothingMore(t *testing.T) {
	for _, ready := range []int{1, 15, 16, 17, 100, 1000} {
		f := &readyFeed{ready: ready, value: []byte("line")}
		l := newCollectLoop(t, f, time.Hour)
		got, err := l.collect(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != ready || got[len(got)-1].Position != int64(4*ready) {
			t.Errorf("%d ready: a batch of %d records, last at %d; want %d, last at %d",
				ready, len(got), got[len(got)-1].Position, ready, 4*ready)
		}
		if l.backlogged {
			t.Errorf("%d ready: the loop takes the feed as backlogged after a batch that closed short", ready)
		}
	}
}

// TestCollect_FullBatchWaits: a batch that closes full says the feed has a
// backlog: the next batch waits for records up to BatchWait (it found
// none here, after polling once past the first), and the one after it
// closes at once again.
func TestCollect_FullBatchWaits(t *testing.T) {
	f := &readyFeed{ready: DefaultBatchMax + 3, value: []byte("x")}
	// The wait must outlast the scheduling delay of a loaded machine: a
	// batch whose wait ran out before its next poll polls no more (1 ms
	// here saw 0 polls waited beside two CPU hogs).
	l := newCollectLoop(t, f, 300*time.Millisecond)
	got, err := l.collect(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != DefaultBatchMax || !l.backlogged {
		t.Fatalf("first batch: %d records, backlogged %v; want %d, true", len(got), l.backlogged, DefaultBatchMax)
	}
	f.waiting = 0
	got, err = l.collect(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || f.waiting != 1 || l.backlogged {
		t.Errorf("second batch: %d records, %d polls waited, backlogged %v; want 3, 1, false", len(got), f.waiting, l.backlogged)
	}
	f.ready, f.waiting = 2, 0
	if got, err = l.collect(context.Background(), nil); err != nil || len(got) != 2 || f.waiting != 0 {
		t.Errorf("third batch: %d records (%v), %d polls waited; want 2, none", len(got), err, f.waiting)
	}
}

// BenchmarkCollect is the collection path alone: batches of DefaultBatchMax
// 100-byte records from a feed that always has them ready (full speed),
// and batches of 10 records from a feed that then has nothing more (a
// modest rate: the batch closes at once). ns/op is per record.
func BenchmarkCollect(b *testing.B) {
	value := make([]byte, 100)
	for _, bc := range []struct {
		name  string
		ready int // per batch, -1 without end
	}{{"Full", -1}, {"Short10", 10}} {
		b.Run(bc.name, func(b *testing.B) {
			f := &readyFeed{ready: bc.ready, value: value}
			l := newCollectLoop(b, f, 5*time.Millisecond)
			buf := make([]Record, 0, DefaultBatchMax)
			b.ReportAllocs()
			b.ResetTimer()
			records := 0
			for records < b.N {
				if bc.ready >= 0 {
					f.ready = bc.ready
				}
				got, err := l.collect(context.Background(), buf[:0])
				if err != nil {
					b.Fatal(err)
				}
				records += len(got)
			}
			b.ReportMetric(float64(f.polls)/float64(records), "polls/record")
		})
	}
}
