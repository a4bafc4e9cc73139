package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// relayRows reads limit rows after id after from SQLite.
func relayRows(t *testing.T, s *outbox.Store, after int64, limit int) []outbox.Row {
	t.Helper()
	rows, err := s.RelayRows(context.Background(), after, limit)
	must(t, err)
	return rows
}

func sameRows(t *testing.T, what string, got, want []outbox.Row) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

func TestStore_RecentRows(t *testing.T) {
	ctx := context.Background()

	// The cached rows are exactly what SQLite returns: ids, places, empty
	// against null keys and values, headers, creation time.
	t.Run("SameAsSQLite", func(t *testing.T) {
		s, clk := openStore(t)
		emit(t, s, place("f", 1), out("t", "k", "v"))
		clk.Add(1)
		tx := begin(t, s)
		must(t, tx.BeginItem(outbox.Place{Feed: "g", Partition: 7, Epoch: "ep", Position: 40}))
		buf := []byte("key-1")
		must(t, tx.Emit(ctx, outbox.Output{Topic: "a", Key: buf, Value: []byte{},
			Headers: []outbox.Header{{Key: "h", Value: []byte("x")}}}))
		copy(buf, "XXXXX") // Emit copied it
		must(t, tx.Emit(ctx, outbox.Output{Topic: "b", Key: []byte{}, Value: nil}))
		must(t, tx.EndItem())
		for i := range int64(70) { // chunks of 64, 4 and 2 after the first two
			must(t, tx.BeginItem(place("f", 100+i)))
			must(t, tx.Emit(ctx, out("t", fmt.Sprint("k", i), fmt.Sprint("v", i))))
			must(t, tx.EndItem())
		}
		must(t, tx.Commit())

		want := relayRows(t, s, 1, 100)
		equal(t, "rows in SQLite", len(want), 72)
		equal(t, "stored key", string(want[0].Key), "key-1")
		sameRows(t, "RecentRows(1, 100)", s.RecentRows(1, 100), want)
		sameRows(t, "RecentRows(1, 5)", s.RecentRows(1, 5), want[:5])
		// Asking past a row forgets it: the relay has published it.
		sameRows(t, "RecentRows(10, 3)", s.RecentRows(10, 3), want[9:12])
		if got := s.RecentRows(5, 3); got != nil {
			t.Fatalf("RecentRows(5, 3) after the cache moved past row 6 = %+v, want nil", got)
		}
		if got := s.RecentRows(73, 3); got != nil {
			t.Fatalf("RecentRows(73, 3) past the last row = %+v, want nil", got)
		}
	})

	// Only committed rows are cached.
	// Rows come across commits, up to the limit, and asking past some
	// drops them.
	t.Run("AcrossCommits", func(t *testing.T) {
		s, _ := openStore(t)
		for i := range int64(5) {
			emit(t, s, place("f", i+1), out("t", "", "a"), out("t", "", "b"), out("t", "", "c"))
		}
		all := relayRows(t, s, 0, 100)
		equal(t, "rows", len(all), 15)
		sameRows(t, "RecentRows(0, 100)", s.RecentRows(0, 100), all)
		sameRows(t, "RecentRows(2, 7)", s.RecentRows(2, 7), all[2:9])
		sameRows(t, "RecentRows(9, 100)", s.RecentRows(9, 100), all[9:])
		if got := s.RecentRows(8, 100); got != nil {
			t.Fatalf("RecentRows(8, 100) after rows up to 9 were dropped = %d rows", len(got))
		}
		if got := s.RecentRows(15, 100); got != nil {
			t.Fatalf("RecentRows(15, 100) = %d rows, want none", len(got))
		}
		emit(t, s, place("f", 9), out("t", "", "d"))
		sameRows(t, "RecentRows(15, 100) after a commit", s.RecentRows(15, 100), relayRows(t, s, 15, 100))
	})

	// Rows of one commit come back without a copy, yet a caller that
	// appends to them (the relay filling a short batch) never writes
	// into the cache.
	t.Run("AppendLeavesCacheAlone", func(t *testing.T) {
		s, _ := openStore(t)
		emit(t, s, place("f", 1), out("t", "", "a"), out("t", "", "b"), out("t", "", "c"), out("t", "", "d"))
		all := relayRows(t, s, 0, 100)
		head := s.RecentRows(0, 2)
		sameRows(t, "RecentRows(0, 2)", head, all[:2])
		_ = append(head, outbox.Row{ID: 99, Topic: "bogus"})
		sameRows(t, "RecentRows(2, 100) after an append to the first two", s.RecentRows(2, 100), all[2:])
	})

	t.Run("RollbackAndFailedCommit", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		must(t, tx.Emit(ctx, out("t", "k", "v")))
		must(t, tx.EndItem())
		must(t, tx.Rollback())
		s.SetCommitHook(func(context.Context) error { return errors.New("injected") })
		tx = begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		must(t, tx.Emit(ctx, out("t", "k", "v")))
		must(t, tx.EndItem())
		if err := tx.Commit(); err == nil {
			t.Fatal("commit with a failing hook succeeded")
		}
		if got := s.RecentRows(0, 10); got != nil {
			t.Fatalf("RecentRows after no commit = %+v", got)
		}
		s.SetCommitHook(nil)
		emit(t, s, place("f", 1), out("t", "k", "v"))
		sameRows(t, "after a commit", s.RecentRows(0, 10), relayRows(t, s, 0, 10))
		equal(t, "first id", relayRows(t, s, 0, 10)[0].ID, int64(1))
	})

	// A commit bigger than the cache's bytes keeps its newest rows; the
	// oldest are read from SQLite. Going over the bound drops the oldest
	// commits, whole.
	t.Run("Bounded", func(t *testing.T) {
		s, _ := openStore(t)
		const n = 50_000
		value := string(make([]byte, 1024))
		tx := begin(t, s)
		for i := range int64(n) {
			must(t, tx.BeginItem(place("f", i+1)))
			must(t, tx.Emit(ctx, out("t", "", value)))
			must(t, tx.EndItem())
		}
		must(t, tx.Commit())
		if got := s.RecentRows(0, 10); got != nil {
			t.Fatalf("RecentRows(0, 10) = %d rows, want none: row 1 is not cached", len(got))
		}
		kept := int64(outbox.MaxRecentBytes / (outbox.CachedRowOverhead + len(value)))
		first := n - kept
		if got := s.RecentRows(first-1, 10); got != nil {
			t.Fatalf("RecentRows(%d, 10) = %d rows, want none: only the newest %d rows fit", first-1, len(got), kept)
		}
		sameRows(t, "the newest rows", s.RecentRows(first, 100), relayRows(t, s, first, 100))
		emit(t, s, place("f", n+1), out("t", "", "w"))
		sameRows(t, "a small commit beside them", s.RecentRows(first+100, 100), relayRows(t, s, first+100, 100))
		emit(t, s, place("f", n+2), out("t", "", string(make([]byte, 256<<10))))
		if got := s.RecentRows(n-1, 10); got != nil {
			t.Fatalf("RecentRows(%d, 10) = %d rows, want none: the big commit was dropped", n-1, len(got))
		}
		sameRows(t, "the next commits", s.RecentRows(n, 10), relayRows(t, s, n, 10))
	})
}
