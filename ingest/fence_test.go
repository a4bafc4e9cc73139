package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// droppingFeed is a memFeed that records what the loop dropped.
type droppingFeed struct {
	*memFeed
	mu      sync.Mutex
	dropped []ingest.Record
}

func (f *droppingFeed) Dropped(_ context.Context, recs []ingest.Record) {
	f.mu.Lock()
	f.dropped = append(f.dropped, recs...)
	f.mu.Unlock()
}

func (f *droppingFeed) droppedItems() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var vs []string
	for _, r := range f.dropped {
		if r.Kind == ingest.RecordItem {
			vs = append(vs, fmt.Sprintf("%d:%s", r.Partition, r.Item.Value))
		}
	}
	return vs
}

// fencingCounter is a counter that runs fence once, at the first try of
// the item whose value is at.
type fencingCounter struct {
	*counter
	at    string
	once  sync.Once
	fence func() error
	err   error
}

func (c *fencingCounter) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if string(item.Value) == c.at {
		c.once.Do(func() { c.err = c.fence() })
	}
	return pgCount(ctx, tx, item)
}

// pgCount counts item's value and emits it (the counter's writes, in SQL
// PostgreSQL takes: n qualified in the upsert).
func pgCount(ctx context.Context, tx *outbox.Tx, item ingest.Item) error {
	if _, err := tx.Exec(ctx, `INSERT INTO counts VALUES (?, 1) ON CONFLICT(value) DO UPDATE SET n = counts.n + 1`,
		string(item.Value)); err != nil {
		return err
	}
	return tx.Emit(ctx, outbox.Output{Topic: "out", Value: item.Value})
}

// pgCounter is the counter's Setup with pgCount.
type pgCounter struct{ *counter }

func (c pgCounter) Apply(ctx context.Context, tx *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
	return pgCount(ctx, tx, item)
}

// TestLoop_PartitionFenced: two servers share a PostgreSQL database (two
// stores); a holds partitions 0 and 1 of a group feed. In the middle of
// a's batch of partition 0, b claims partition 0: a's commit is fenced
// (outbox.ErrPartitionFenced), a drops the batch, tells its feed, and goes
// on with partition 1; b applies partition 0's items from the stored
// position. Every item is applied once, every output is once.
func TestLoop_PartitionFenced(t *testing.T) {
	dsn := pgtest.New(t).DSN
	ctx := context.Background()
	a := outboxtest.OpenStore(t, outbox.DefaultConfig(dsn))
	b := outboxtest.OpenStore(t, outbox.DefaultConfig(dsn))
	for _, p := range []int32{0, 1} {
		if _, err := a.ClaimPartition(ctx, "f", p, "a"); err != nil {
			t.Fatal(err)
		}
	}
	fa := &droppingFeed{memFeed: newMemFeed("e", "v1", "v2", "v3", "v4", "v5")}
	proc := &fencingCounter{counter: newCounter(), at: "v3", fence: func() error {
		_, err := b.ClaimPartition(ctx, "f", 0, "b")
		return err
	}}
	cfg := testConfig()
	la, stopA := running(t, a, fa, proc, cfg)
	wait(t, 10*time.Second, func() error {
		if got := fa.droppedItems(); len(got) != 5 {
			return fmt.Errorf("dropped %v, want the batch v1..v5", got)
		}
		return nil
	})
	if proc.err != nil {
		t.Fatal(proc.err)
	}
	equal(t, "dropped", fmt.Sprint(fa.droppedItems()), "[0:v1 0:v2 0:v3 0:v4 0:v5]")
	if n := len(counts(t, a)); n != 0 {
		t.Fatalf("counts after the fenced batch: %d values, want none committed", n)
	}
	// a goes on with the partition it still holds.
	fa.add(ingest.Record{Kind: ingest.RecordEpoch, Partition: 1, Epoch: "e1"},
		ingest.Record{Kind: ingest.RecordItem, Partition: 1, Epoch: "e1", Position: 1, Item: ingest.Item{Value: []byte("w1")}},
		ingest.Record{Kind: ingest.RecordItem, Partition: 1, Epoch: "e1", Position: 2, Item: ingest.Item{Value: []byte("w2")}})
	wait(t, 10*time.Second, func() error {
		if c := counts(t, a); c["w1"] != 1 || c["w2"] != 1 {
			return fmt.Errorf("counts %v, want w1 and w2 once", c)
		}
		return nil
	})
	if st, e := la.State(); st == outbox.StateFailed {
		t.Fatalf("a's feed failed after a partition fence: %s", e)
	}
	// b, the new owner of partition 0, applies it from the stored position.
	cps, err := b.Positions(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	fb := newMemFeed("e", "v1", "v2", "v3", "v4", "v5")
	_, stopB := running(t, b, fb, pgCounter{newCounter()}, cfg)
	equal(t, "partition 0 before b", fmt.Sprint(cps[0].Epoch, "/", cps[0].Position), "e/0")
	wait(t, 10*time.Second, positionIs(b, "f", "e", 5))
	if err := stopB(); err != nil {
		t.Fatalf("b: %v", err)
	}
	if err := stopA(); err != nil {
		t.Fatalf("a: %v", err)
	}
	c := counts(t, b)
	equal(t, "values", len(c), 7)
	for _, v := range []string{"v1", "v2", "v3", "v4", "v5", "w1", "w2"} {
		equal(t, "count of "+v, c[v], 1)
	}
	rows := outboxRows(t, b)
	equal(t, "outputs", len(rows), 7)
	seen := map[string]int{}
	for _, r := range rows {
		seen[r.Value]++
	}
	for v, n := range seen {
		equal(t, "outputs of "+v, n, 1)
	}
	// A database-wide fence still ends the feed.
	if !errors.Is(outbox.ErrPartitionFenced, outbox.ErrFenced) {
		t.Fatal("ErrPartitionFenced does not match ErrFenced")
	}
}

// pgRejecting is pgCounter that dead-letters values starting with "bad"
// as malformed.
type pgRejecting struct{ *counter }

func (c pgRejecting) Apply(ctx context.Context, tx *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
	if strings.HasPrefix(string(item.Value), "bad") {
		return ingest.Malformed("value %q is bad", item.Value)
	}
	return pgCount(ctx, tx, item)
}

// TestLoop_RequeueOfAMovedPartition: a dead letter's requeue on the
// server whose partition another server took since fails alone, saying
// so; the feed goes on, and nothing of the requeue is committed.
func TestLoop_RequeueOfAMovedPartition(t *testing.T) {
	dsn := pgtest.New(t).DSN
	ctx := context.Background()
	a := outboxtest.OpenStore(t, outbox.DefaultConfig(dsn))
	b := outboxtest.OpenStore(t, outbox.DefaultConfig(dsn))
	for _, p := range []int32{0, 1} {
		if _, err := a.ClaimPartition(ctx, "f", p, "a"); err != nil {
			t.Fatal(err)
		}
	}
	fa := &droppingFeed{memFeed: newMemFeed("e", "v1", "bad1", "v2")}
	la, stopA := running(t, a, fa, pgRejecting{newCounter()}, testConfig())
	wait(t, 10*time.Second, positionIs(a, "f", "e", 3))
	dls, err := a.DeadLetters(ctx, "f", 0, 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %d (%v), want 1", len(dls), err)
	}
	if _, err := b.ClaimPartition(ctx, "f", 0, "b"); err != nil {
		t.Fatal(err)
	}
	ok, err := la.RequeueWith(ctx, dls[0].ID, outbox.Requeue{Payload: []byte("fixed")}) // an operator's edit
	if ok || !errors.Is(err, outbox.ErrPartitionFenced) || !strings.Contains(err.Error(), "partition 0 is another server's now") {
		t.Fatalf("Requeue of a moved partition's dead letter = %v, %v; want false and the partition named", ok, err)
	}
	if st, e := la.State(); st == outbox.StateFailed {
		t.Fatalf("a's feed failed after a fenced requeue: %s", e)
	}
	// a goes on with partition 1.
	fa.add(ingest.Record{Kind: ingest.RecordEpoch, Partition: 1, Epoch: "e1"},
		ingest.Record{Kind: ingest.RecordItem, Partition: 1, Epoch: "e1", Position: 1, Item: ingest.Item{Value: []byte("w1")}})
	wait(t, 10*time.Second, func() error {
		if c := counts(t, a); c["w1"] != 1 {
			return fmt.Errorf("counts %v, want w1 once", c)
		}
		return nil
	})
	if err := stopA(); err != nil {
		t.Fatalf("a: %v", err)
	}
	equal(t, "counts", fmt.Sprint(counts(t, a)), "map[v1:1 v2:1 w1:1]")
	dl, err := a.DeadLetterByID(ctx, "f", dls[0].ID)
	if err != nil || dl.Resolved() {
		t.Fatalf("the dead letter after the fenced requeue: resolved %v (%v), want it still open", dl.Resolved(), err)
	}
}
