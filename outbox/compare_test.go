package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/outboxd/outboxd/outbox"
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
	var store int
	must(t, outbox.ReadPoolOf(s).GetContext(ctx, &store, "PRAGMA temp_store"))
	if store != 2 {
		t.Fatalf("temp_store %d after the cursor closed, want 2 (memory) as the pool opens it", store)
	}
}
