package orders_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestProcessor_PostgresKeyNotText: on PostgreSQL an order id that is not
// UTF-8, or holds a NUL, is malformed (its text column cannot keep it):
// the record is dead-lettered with that reason, and the orders around it
// apply, whether Prepare read the batch's keys first or not.
func TestProcessor_PostgresKeyNotText(t *testing.T) {
	dsn := pgtest.New(t).DSN
	h := newHarness(t, func(*orders.Config) {})
	h.store = outboxtest.OpenStore(t, outbox.DefaultConfig(dsn))
	testutil.Must(t, h.store.RegisterFeed(context.Background(), outbox.FeedInfo{Name: feed}))
	testutil.Must(t, h.inTx(func(tx *outbox.Tx) error { return h.proc.Setup(context.Background(), tx) }))
	for i, key := range []string{"bad\xffkey", "nul\x00key"} {
		testutil.Must(t, h.inTx(func(tx *outbox.Tx) error {
			return h.proc.Prepare(context.Background(), tx, feed, []ingest.Item{{Key: []byte(key)}, {Key: []byte("ok")}})
		}))
		rows, err := h.apply(0, int64(i), key, event("placed", 1))
		p, ok := ingest.IsPermanent(err)
		if !ok || p.Reason != ingest.ReasonMalformed || len(rows) != 0 {
			t.Fatalf("key %q: %d outputs, error %v; want none, malformed", key, len(rows), err)
		}
	}
	rows, err := h.apply(0, 2, "ok", event("placed", 1))
	testutil.Must(t, err)
	if len(rows) != 1 || rows[0].Topic != "orders.status" {
		t.Fatalf("outputs of a good key after two bad ones: %+v, want one status", rows)
	}
	st, err := orders.Statuses(context.Background(), h.store, feed)
	testutil.Must(t, err)
	if len(st) != 1 || st["ok"] != orders.Status("placed") {
		t.Fatalf("statuses = %v, want ok placed", st)
	}
}
