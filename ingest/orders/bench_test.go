package orders

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// benchEvents yields events over a fixed number of open orders, as server
// bench does: each the next step of a pseudo-random one, a delivered order
// replaced by a new one.
type benchEvents struct {
	orders int
	i      int64
	step   []uint8
	gen    []uint32
}

func (g *benchEvents) next() (ingest.Delivery, ingest.Item) {
	x := uint64(g.i)*0x9e3779b97f4a7c15 + 1
	x ^= x >> 31
	s := int(x % uint64(g.orders))
	steps := []string{"placed", "paid", "shipped", "delivered"}
	typ := steps[g.step[s]]
	if g.step[s]++; int(g.step[s]) == len(steps) {
		g.step[s] = 0
		g.gen[s]++
	}
	key := "o-" + strconv.Itoa(s) + "-" + strconv.FormatUint(uint64(g.gen[s]), 10)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(g.i) * time.Millisecond)
	value := `{"type":"` + typ + `","at":"` + at.Format(time.RFC3339Nano) + `"}`
	g.i++
	part := int32(g.i % 3)
	d := ingest.Delivery{Feed: "orders", Partition: part, Topic: "orders.events", Epoch: "topic:" + strconv.Itoa(int(part)),
		Position: g.i + 1, Attempt: 1}
	return d, ingest.Item{Key: []byte(key), Value: []byte(value)}
}

// BenchmarkBatch applies order events in transactions of 4,000, as the
// ingest loop does (Prepare, then each item in its turn, then the commit),
// over a state of open orders, against the statement-per-item reference.
// ns/op is per event.
func BenchmarkBatch(b *testing.B) {
	for _, orders := range []int{1000, 100_000} {
		for _, impl := range []string{"batched", "reference"} {
			b.Run(fmt.Sprintf("orders=%d/%s", orders, impl), func(b *testing.B) {
				sd := benchSide(b, impl == "reference")
				g := &benchEvents{orders: orders, step: make([]uint8, orders), gen: make([]uint32, orders)}
				// The state first: every open order placed, untimed.
				for n := 0; n < orders; {
					k := min(4000, orders-n)
					sd.benchTx(b, g, k)
					n += k
				}
				b.ReportAllocs()
				b.ResetTimer()
				for n := 0; n < b.N; {
					k := min(4000, b.N-n)
					sd.benchTx(b, g, k)
					n += k
				}
			})
		}
	}
}

func benchSide(b *testing.B, ref bool) *side {
	b.Helper()
	cfg := DefaultConfig("orders", "orders.events")
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(b.TempDir()+"/bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.RegisterFeed(ctx, outbox.FeedInfo{Name: "orders"}); err != nil {
		b.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Setup(ctx, tx); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	sd := &side{name: "bench", store: s, apply: p.Apply, prepare: p.Prepare}
	if ref {
		sd.apply, sd.prepare = reference{p}.Apply, nil
	}
	return sd
}

// benchTx applies the next k events of g in one transaction.
func (sd *side) benchTx(b *testing.B, g *benchEvents, k int) {
	ctx := context.Background()
	ds := make([]ingest.Delivery, k)
	items := make([]ingest.Item, k)
	for i := range k {
		ds[i], items[i] = g.next()
	}
	tx, err := sd.store.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	if sd.prepare != nil {
		if err := sd.prepare(ctx, tx, "orders", items); err != nil {
			b.Fatal(err)
		}
	}
	for i := range k {
		if err := tx.BeginItem(ds[i].Place()); err != nil {
			b.Fatal(err)
		}
		if err := sd.apply(ctx, tx, ds[i], items[i]); err != nil {
			b.Fatal(err)
		}
		if err := tx.EndItem(); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}
