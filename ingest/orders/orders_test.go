package orders_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

const (
	feed   = "orders"
	source = "orders.events"
	epoch  = "topicid:0"
)

var now = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

// harness applies records one transaction each and collects the outputs.
type harness struct {
	t     *testing.T
	store *outbox.Store
	proc  *orders.Processor
	after int64 // last outbox row seen
}

func newHarness(t *testing.T, mod ...func(*orders.Config)) *harness {
	t.Helper()
	s := outboxtest.NewStore(t, nil)
	if err := s.RegisterFeed(context.Background(), outbox.FeedInfo{Name: feed}); err != nil {
		t.Fatal(err)
	}
	cfg := orders.DefaultConfig(feed, source)
	cfg.Now = func() time.Time { return now }
	for _, m := range mod {
		m(&cfg)
	}
	p, err := orders.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, store: s, proc: p}
	for range 2 { // Setup may run on every start
		h.inTx(func(tx *outbox.Tx) error { return p.Setup(context.Background(), tx) })
	}
	return h
}

func (h *harness) inTx(f func(tx *outbox.Tx) error) error {
	h.t.Helper()
	tx, err := h.store.Begin(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	defer tx.Rollback()
	ferr := f(tx)
	if err := tx.Commit(); err != nil {
		h.t.Fatal(err)
	}
	return ferr
}

// apply applies one record of partition p (a feed partition) at offset
// off, and returns the outputs it emitted and Apply's error.
func (h *harness) apply(p int32, off int64, key, value string, hs ...outbox.Header) ([]outbox.Row, error) {
	h.t.Helper()
	d := ingest.Delivery{Feed: feed, Partition: p, Topic: source, Epoch: fmt.Sprintf("e%d", p), Position: off + 1, Attempt: 1}
	if p == 0 {
		d.Epoch = epoch
	}
	if p == retryPart {
		d.Topic = feed + ".retry"
	}
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	err := h.inTx(func(tx *outbox.Tx) error {
		if err := tx.BeginItem(d.Place()); err != nil {
			return err
		}
		err := h.proc.Apply(context.Background(), tx, d, ingest.Item{Key: k, Value: []byte(value), Headers: hs})
		if err != nil {
			if rerr := tx.RollbackItem(); rerr != nil {
				h.t.Fatal(rerr)
			}
			return err
		}
		return tx.EndItem()
	})
	rows, rerr := h.store.Rows(context.Background(), h.after, 100)
	if rerr != nil {
		h.t.Fatal(rerr)
	}
	if len(rows) > 0 {
		h.after = rows[len(rows)-1].ID
	}
	return rows, err
}

func event(typ string, minute int) string {
	return fmt.Sprintf(`{"type":%q,"at":"2026-05-01T09:%02d:00Z"}`, typ, minute)
}

// wantChanges checks rows are status changes of order o, in order.
func wantChanges(t *testing.T, rows []outbox.Row, o string, want ...string) {
	t.Helper()
	var got []string
	for _, r := range rows {
		if r.Topic != feed+".status" || string(r.Key) != o {
			t.Fatalf("row on %s keyed %q, want %s.status keyed %q", r.Topic, r.Key, feed, o)
		}
		var c orders.StatusChange
		if err := json.Unmarshal(r.Value, &c); err != nil {
			t.Fatal(err)
		}
		if c.OrderID != o {
			t.Fatalf("change %+v of another order", c)
		}
		got = append(got, fmt.Sprintf("%s>%s@%02d", c.Previous, c.Status, c.At.Minute()))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
}

func TestProcessor_InOrder(t *testing.T) {
	h := newHarness(t)
	for i, step := range []struct{ typ, want string }{
		{"placed", ">placed@01"}, {"paid", "placed>paid@02"}, {"shipped", "paid>shipped@03"}, {"delivered", "shipped>delivered@04"},
	} {
		rows, err := h.apply(0, int64(i), "o-1", event(step.typ, i+1))
		if err != nil {
			t.Fatal(err)
		}
		wantChanges(t, rows, "o-1", step.want)
	}
	st, err := orders.Statuses(context.Background(), h.store, feed)
	if err != nil || st["o-1"] != orders.Delivered {
		t.Fatalf("statuses %v, %v", st, err)
	}
}

func TestProcessor_DeadLetters(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct{ key, value, reason string }{
		{"", event("placed", 1), orders.ReasonMalformed},
		{"o", "{", orders.ReasonMalformed},
		{"o", `{"at":"2026-05-01T09:00:00Z"}`, orders.ReasonMalformed},
		{"o", `{"type":"placed"}`, orders.ReasonMalformed},
		{"o", event("returned", 1), orders.ReasonUnknownType},
	} {
		rows, err := h.apply(0, 0, c.key, c.value)
		p, ok := ingest.IsPermanent(err)
		if !ok || p.Reason != c.reason || len(rows) != 0 {
			t.Errorf("%q %q: %v and %d rows, want a permanent %s error and none", c.key, c.value, err, len(rows), c.reason)
		}
	}
}

// retryHeaders checks row is a retry record of the event at offset off,
// for attempt, due after delay, and returns its headers.
func retryHeaders(t *testing.T, row outbox.Row, off int64, attempt int, delay time.Duration) []outbox.Header {
	t.Helper()
	hs, err := outbox.DecodeHeaders(row.Headers)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		ingest.HeaderOrigTopic: source, ingest.HeaderOrigPartition: "0", ingest.HeaderOrigEpoch: epoch,
		ingest.HeaderOrigOffset: strconv.FormatInt(off, 10), ingest.HeaderRetryAttempt: strconv.Itoa(attempt),
		ingest.HeaderRetryDue: strconv.FormatInt(now.Add(delay).UnixMilli(), 10),
	}
	for k, v := range want {
		if got, _ := ingest.HeaderValue(hs, k); string(got) != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if row.Topic != feed+".retry" {
		t.Errorf("retry on %s", row.Topic)
	}
	return hs
}

// retryPart is the feed partition of the retry topic's partition 0.
const retryPart = 1 << 16

func TestProcessor_Retry(t *testing.T) {
	h := newHarness(t)
	// paid (offset 0) comes before placed (offset 1): refused, retried.
	rows, err := h.apply(0, 0, "o-2", event("paid", 2))
	if err != nil || len(rows) != 1 {
		t.Fatalf("refused event: %v, %d rows; want a retry", err, len(rows))
	}
	hs := retryHeaders(t, rows[0], 0, 2, time.Second)
	if rows, err := h.apply(0, 1, "o-2", event("placed", 1)); err != nil {
		t.Fatal(err)
	} else {
		wantChanges(t, rows, "o-2", ">placed@01")
	}
	rows, err = h.apply(retryPart, 0, "o-2", event("paid", 2), hs...)
	if err != nil {
		t.Fatal(err)
	}
	wantChanges(t, rows, "o-2", "placed>paid@02")

	t.Run("AppliedOnce", func(t *testing.T) {
		rows, err := h.apply(retryPart, 7, "o-2", event("paid", 2), hs...)
		if err != nil || len(rows) != 0 {
			t.Fatalf("the retry again: %v, %d rows; want nothing", err, len(rows))
		}
	})
	t.Run("DelayDoubles", func(t *testing.T) {
		rows, err := h.apply(0, 5, "o-3", event("shipped", 3))
		for attempt := 2; attempt <= 5; attempt++ {
			if err != nil || len(rows) != 1 {
				t.Fatalf("attempt %d: %v, %d rows; want a retry", attempt-1, err, len(rows))
			}
			hs := retryHeaders(t, rows[0], 5, attempt, time.Second<<(attempt-2))
			rows, err = h.apply(retryPart, int64(attempt), "o-3", event("shipped", 3), hs...)
		}
		// The fifth attempt was the last: dead-lettered, after 5 attempts.
		p, ok := ingest.IsPermanent(err)
		if !ok || p.Reason != orders.ReasonInvalidTransition || len(rows) != 0 || p.Attempts != 5 {
			t.Fatalf("last attempt: %v (%d attempts), %d rows; want a permanent invalid-transition after 5", err, p.Attempts, len(rows))
		}
	})
	t.Run("OneOfEachHeader", func(t *testing.T) {
		// A retry record as read back from Kafka: its headers, then the
		// relay's. Its next round carries each outboxd-* header once.
		rows, err := h.apply(0, 20, "o-5", event("shipped", 3))
		if err != nil || len(rows) != 1 {
			t.Fatalf("%v, %d rows; want a retry", err, len(rows))
		}
		read := append(retryHeaders(t, rows[0], 20, 2, time.Second),
			outbox.Header{Key: "trace", Value: []byte("t")}, outbox.Header{Key: outbox.HeaderID, Value: []byte("77")},
			outbox.Header{Key: outbox.HeaderFeed, Value: []byte(feed)}, outbox.Header{Key: outbox.HeaderEpoch, Value: []byte("r:0")},
			outbox.Header{Key: outbox.HeaderPosition, Value: []byte("3")})
		rows, err = h.apply(retryPart, 3, "o-5", event("shipped", 3), read...)
		if err != nil || len(rows) != 1 {
			t.Fatalf("%v, %d rows; want a retry", err, len(rows))
		}
		hs := retryHeaders(t, rows[0], 20, 3, 2*time.Second)
		seen := map[string]int{}
		for _, hd := range hs {
			seen[hd.Key]++
		}
		for k, n := range seen {
			if n != 1 || k == outbox.HeaderID {
				t.Errorf("header %s %d times in %q", k, n, hs)
			}
		}
		if seen["trace"] != 1 || len(seen) != 7 {
			t.Errorf("headers %q: want the item's own, and six outboxd-orig-* and -retry-* ones", hs)
		}
	})
	t.Run("NoPlace", func(t *testing.T) {
		_, err := h.apply(retryPart, 9, "o-4", event("paid", 2))
		if p, ok := ingest.IsPermanent(err); !ok || p.Reason != orders.ReasonMalformed {
			t.Fatalf("retry record without headers: %v, want malformed", err)
		}
	})
}

func TestProcessor_WithoutRetryTopic(t *testing.T) {
	h := newHarness(t, func(c *orders.Config) { c.RetryTopic = "" })
	rows, err := h.apply(0, 0, "o", event("paid", 2))
	if p, ok := ingest.IsPermanent(err); !ok || p.Reason != orders.ReasonInvalidTransition || len(rows) != 0 || p.Attempts != 1 {
		t.Fatalf("%v, %d rows; want a permanent invalid-transition at once, after 1 attempt", err, len(rows))
	}
}

func TestProcessor_LateEventInTheMiddle(t *testing.T) {
	h := newHarness(t)
	h.apply(0, 0, "o", event("placed", 1))
	if rows, err := h.apply(0, 1, "o", event("cancelled", 3)); err != nil {
		t.Fatal(err)
	} else {
		wantChanges(t, rows, "o", "placed>cancelled@03")
	}
	rows, err := h.apply(0, 2, "o", event("paid", 2))
	if err != nil {
		t.Fatal(err)
	}
	wantChanges(t, rows, "o", "placed>paid@02", "paid>cancelled@03")
	st, _ := orders.Statuses(context.Background(), h.store, feed)
	if st["o"] != orders.Cancelled {
		t.Fatalf("status %q, want cancelled", st["o"])
	}
}

func TestProcessor_DuplicateUpstream(t *testing.T) {
	h := newHarness(t)
	h.apply(0, 0, "o", event("placed", 1))
	rows, err := h.apply(0, 1, "o", event("placed", 1))
	if err != nil || len(rows) != 0 {
		t.Fatalf("the same event at another offset: %v, %d rows; want nothing", err, len(rows))
	}
}

func TestConfig_Validate(t *testing.T) {
	good := orders.DefaultConfig("orders", "orders.events")
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*orders.Config){
		"NoSource":       func(c *orders.Config) { c.SourceTopic = "" },
		"NoStatus":       func(c *orders.Config) { c.StatusTopic = "" },
		"RetryIsStatus":  func(c *orders.Config) { c.RetryTopic = c.StatusTopic },
		"NoDelay":        func(c *orders.Config) { c.RetryDelay = 0 },
		"NoAttempts":     func(c *orders.Config) { c.RetryAttempts = 0 },
		"NoWorkDeadline": func(c *orders.Config) { c.WorkDeadline = 0 },
	} {
		c := good
		mod(&c)
		if _, err := orders.New(c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
