package orders_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestProcessor_Compaction shows a finished order's events leave
// orders_events for one row of orders_done, and that the compacted history
// still decides: an event that comes back changes nothing, a late one
// folds into it, an invalid one is refused.
func TestProcessor_Compaction(t *testing.T) {
	h := newHarness(t)
	counts := func() (open, done int) {
		t.Helper()
		ctx := context.Background()
		if err := outboxtest.Get(ctx, h.store, &open, `SELECT count(*) FROM orders_events WHERE feed = ?`, feed); err != nil {
			t.Fatal(err)
		}
		if err := outboxtest.Get(ctx, h.store, &done, `SELECT count(*) FROM orders_done WHERE feed = ?`, feed); err != nil {
			t.Fatal(err)
		}
		return open, done
	}
	for i, typ := range []string{"placed", "paid", "shipped"} {
		if _, err := h.apply(0, int64(i), "a", event(typ, i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.apply(0, 3, "b", event("placed", 1)); err != nil {
		t.Fatal(err)
	}
	if open, done := counts(); open != 4 || done != 0 {
		t.Fatalf("before a is delivered: %d open events, %d done orders; want 4, 0", open, done)
	}
	rows, err := h.apply(0, 4, "a", event("delivered", 4))
	if err != nil {
		t.Fatal(err)
	}
	wantChanges(t, rows, "a", "shipped>delivered@04")
	if open, done := counts(); open != 1 || done != 1 {
		t.Fatalf("after a is delivered: %d open events (b's), %d done orders; want 1, 1", open, done)
	}
	var n int
	length := `SELECT json_array_length(history) FROM orders_done WHERE order_id = 'a'`
	if h.store.Postgres() {
		length = `SELECT json_array_length(history::json) FROM orders_done WHERE order_id = 'a'`
	}
	if err := outboxtest.Get(context.Background(), h.store, &n, length); err != nil || n != 4 {
		t.Fatalf("a's compacted history holds %d events (%v), want 4", n, err)
	}

	t.Run("ComeBack", func(t *testing.T) {
		// The same event at another offset: a duplicate of a compacted one.
		if rows, err := h.apply(0, 5, "a", event("paid", 2)); err != nil || len(rows) != 0 {
			t.Fatalf("a compacted event again: %v, %d rows; want nothing", err, len(rows))
		}
	})
	t.Run("Refused", func(t *testing.T) {
		// delivered is final: a cancel after it is refused (sent to retry).
		rows, err := h.apply(0, 6, "a", event("cancelled", 5))
		if err != nil || len(rows) != 1 || rows[0].Topic != feed+".retry" {
			t.Fatalf("a cancel after delivered: %v, %+v; want one retry record", err, rows)
		}
	})
	t.Run("LateEventRecompacts", func(t *testing.T) {
		if _, err := h.apply(0, 7, "b", event("cancelled", 3)); err != nil {
			t.Fatal(err)
		}
		rows, err := h.apply(0, 8, "b", event("paid", 2))
		if err != nil {
			t.Fatal(err)
		}
		wantChanges(t, rows, "b", "placed>paid@02", "paid>cancelled@03")
		if open, done := counts(); open != 0 || done != 2 {
			t.Fatalf("after b's late event: %d open events, %d done orders; want 0, 2", open, done)
		}
		length := `SELECT json_array_length(history) FROM orders_done WHERE order_id = 'b'`
		if h.store.Postgres() {
			length = `SELECT json_array_length(history::json) FROM orders_done WHERE order_id = 'b'`
		}
		if err := outboxtest.Get(context.Background(), h.store, &n, length); err != nil || n != 3 {
			t.Fatalf("b's compacted history holds %d events (%v), want 3", n, err)
		}
	})
}
