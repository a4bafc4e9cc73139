package outbox

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// A feed's backlog is counted over the pending rows; after a scan of many
// rows that took long, its result is reused for ten times that long, then
// counted again. A slow scan of few rows is not reused.
func TestStore_FeedBacklogReuse(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, DefaultConfig(filepath.Join(t.TempDir(), "t.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	emitRows := func(feed string, n int) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		for i := range n {
			if err := tx.BeginItem(Place{Feed: feed, Epoch: "e", Position: int64(i + 1)}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Emit(ctx, Output{Topic: "t", Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			if err := tx.EndItem(); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	pending := func(after int64) int64 {
		t.Helper()
		b, err := s.Backlog(ctx, "f", after)
		if err != nil {
			t.Fatal(err)
		}
		return b.Pending
	}
	emitRows("f", 3)
	emitRows("g", 2)
	if got := pending(0); got != 3 {
		t.Fatalf("pending(0) = %d, want 3", got)
	}
	if got := pending(4); got != 0 {
		t.Fatalf("pending(4) = %d, want 0: a quick scan is not reused", got)
	}

	// Make the last scan of f look slow and recent, over rows (after,
	// after+rows]: over many rows it stands in for a new count.
	slowOver := func(at time.Time, rows int64) {
		s.backlogs.mu.Lock()
		sc := s.backlogs.scans["f"]
		sc.result, sc.took, sc.at = Backlog{Pending: 3}, time.Second, at
		sc.last = sc.after + rows
		s.backlogs.scans["f"] = sc
		s.backlogs.mu.Unlock()
	}
	slow := func(at time.Time) { slowOver(at, scanReuseRows) }
	slowOver(time.Now(), 3)
	if got := pending(1); got != 2 {
		t.Fatalf("pending(1) after a slow scan of 3 rows = %d, want 2: a small scan is not reused", got)
	}
	slow(time.Now())
	if got := pending(1); got != 3 {
		t.Fatalf("pending(1) after a slow scan = %d, want the reused 3", got)
	}
	slow(time.Now().Add(-scanReuseMax - time.Millisecond))
	if got := pending(1); got != 2 {
		t.Fatalf("pending(1) once the slow scan is old = %d, want 2", got)
	}
	// Nothing pending at all needs no scan, whatever was scanned before.
	slow(time.Now())
	if got := pending(5); got != 0 {
		t.Fatalf("pending(5) = %d, want 0", got)
	}
}
