package outbox_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestOutputsByPlace: the outputs of a feed come in place order (partition,
// epoch, position, then id), whatever order they were written in, and the
// sort's connection goes back to the pool with its in-memory temporary
// store, which the multi-row upserts rely on.
func TestOutputsByPlace(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	outbox.ReadPoolOf(s).SetMaxOpenConns(1) // the one connection the cursor borrows
	var wrote []string
	tx := begin(t, s)
	for _, p := range []outbox.Place{
		{Feed: "f", Partition: 1, Epoch: "b", Position: 3},
		{Feed: "f", Partition: 0, Epoch: "b", Position: 9},
		{Feed: "g", Partition: 0, Epoch: "a", Position: 1},
		{Feed: "f", Partition: 0, Epoch: "a", Position: 20},
		{Feed: "f", Partition: 0, Epoch: "a", Position: 7},
	} {
		tx.SetPlace(p)
		for n := range 2 {
			v := fmt.Sprintf("%d/%s/%d/%d", p.Partition, p.Epoch, p.Position, n)
			must(t, tx.Emit(ctx, out("t", "", v)))
			if p.Feed == "f" {
				wrote = append(wrote, v)
			}
		}
	}
	must(t, tx.Commit())
	c, err := s.OutputsByPlace(ctx, "f")
	must(t, err)
	var got []string
	for r, ok := c.Next(); ok; r, ok = c.Next() {
		got = append(got, string(r.Value))
	}
	must(t, c.Err())
	must(t, c.Close())
	want := []string{"0/a/7/0", "0/a/7/1", "0/a/20/0", "0/a/20/1", "0/b/9/0", "0/b/9/1", "1/b/3/0", "1/b/3/1"}
	if !slices.Equal(got, want) {
		t.Fatalf("outputs %v, want %v (written %v)", got, want, wrote)
	}
	if outboxtest.OnPostgres() {
		return // PostgreSQL's sorts spill by themselves: no temp_store
	}
	var store int
	must(t, outbox.ReadPoolOf(s).GetContext(ctx, &store, "PRAGMA temp_store"))
	if store != 2 {
		t.Fatalf("temp_store %d after the cursor closed, want 2 (memory) as the pool opens it", store)
	}
}

// TestOutputsByPlace_Merged: outputs in many chunks over several
// transactions, their places interleaved across chunks (positions going
// back and forth, many outputs at one position), come out in exactly the
// order a sort of all of them by place and id gives.
func TestOutputsByPlace_Merged(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	rng := rand.New(rand.NewPCG(7, 9))
	type key struct {
		part    int32
		epoch   string
		pos, id int64
		value   string
	}
	var want []key
	id := int64(0)
	for range 5 {
		tx := begin(t, s)
		for range 400 {
			p := outbox.Place{Feed: "f", Partition: int32(rng.IntN(2)), Epoch: []string{"a", "b"}[rng.IntN(2)], Position: int64(rng.IntN(50))}
			tx.SetPlace(p)
			for range 1 + rng.IntN(3) {
				id++
				v := fmt.Sprint(id)
				must(t, tx.Emit(ctx, out("t", "", v)))
				want = append(want, key{p.Partition, p.Epoch, p.Position, id, v})
			}
		}
		must(t, tx.Commit())
	}
	slices.SortFunc(want, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.part, b.part), strings.Compare(a.epoch, b.epoch), cmp.Compare(a.pos, b.pos), cmp.Compare(a.id, b.id))
	})
	c, err := s.OutputsByPlace(ctx, "f")
	must(t, err)
	defer c.Close()
	i := 0
	for r, ok := c.Next(); ok; r, ok = c.Next() {
		if i >= len(want) {
			t.Fatalf("more outputs than the %d written", len(want))
		}
		w := want[i]
		if r.ID != w.id || r.Partition != w.part || r.Epoch != w.epoch || r.Position != w.pos || string(r.Value) != w.value {
			t.Fatalf("output %d: %d %d/%s/%d %q, want %+v", i, r.ID, r.Partition, r.Epoch, r.Position, r.Value, w)
		}
		i++
	}
	must(t, c.Err())
	equal(t, "outputs", i, len(want))
}

// TestStateTables_NoneOfOutboxds: a store that only migrated has one
// state table, the built-in ledger's (schema.sql creates it), so every
// other table a migration creates is in OwnTables (else a replay's diff
// would compare an engine table as a processor's).
func TestStateTables_NoneOfOutboxds(t *testing.T) {
	s, _ := openStore(t)
	tables, err := s.StateTables(context.Background())
	must(t, err)
	for _, st := range tables {
		if st.Name != "ledger_balances" {
			t.Errorf("table %s is outboxd's own but not in outbox.OwnTables", st.Name)
		}
	}
}
