package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestPrune_RetentionZeroPrunesPublishedAtOnce(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.Retention = 0
	cfg.CreateTopics = false
	if err := c.CreateTopic("t", 3, nil); err != nil {
		t.Fatal(err)
	}
	ids := emit(t, s, "f", keyed("t", 80, 4, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])
	// The status counts a prune after its delete has committed, so wait
	// for both, then check the count is exact.
	wait(t, 5*time.Second, func() error {
		if n := countOutbox(t, s); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		if st := rr.r.Status(); st.Pruned < 80 {
			return fmt.Errorf("status counts %d pruned rows", st.Pruned)
		}
		return nil
	})
	if st := rr.r.Status(); st.Pruned != 80 {
		t.Errorf("status counts %d pruned rows, want 80", st.Pruned)
	}

	// Rows the relay cannot publish (their topic is missing) stay,
	// however often pruning runs.
	emit(t, s, "f", keyed("missing", 10, 2, 80)...)
	wait(t, 10*time.Second, func() error {
		if st := rr.r.Status(); st.State != StateBackingOff {
			return fmt.Errorf("state %s", st.State)
		}
		return nil
	})
	rr.r.prune(context.Background())
	rr.r.prune(context.Background())
	if n := countOutbox(t, s); n != 10 {
		t.Fatalf("%d rows in the outbox, want the 10 unpublished ones", n)
	}
	// Ids are never reused after pruning: the back-in-time check relies on it.
	if last, _ := s.LastOutboxID(context.Background()); last != 90 {
		t.Errorf("last outbox id %d, want 90", last)
	}
}

func TestPrune_KeepsRowsWithinRetention(t *testing.T) {
	c := newCluster(t)
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, c.ListenAddrs())
	cfg.Retention = time.Hour
	ids := emit(t, s, "f", keyed("t", 30, 3, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])
	rr.r.prune(context.Background())
	if n := countOutbox(t, s); n != 30 {
		t.Fatalf("%d rows in the outbox, want all 30 (published less than an hour ago)", n)
	}
	// An hour later they go, in bulk.
	if _, err := outboxtest.Exec(context.Background(), s, `UPDATE outbox_chunks SET created_at = created_at - ?`, (2 * time.Hour).Nanoseconds()); err != nil {
		t.Fatal(err)
	}
	rr.r.prune(context.Background())
	if n := countOutbox(t, s); n != 0 {
		t.Fatalf("%d rows left after their retention", n)
	}
}

func TestPrune_Interval(t *testing.T) {
	for _, c := range []struct{ retention, want time.Duration }{
		{0, time.Second}, {time.Minute, time.Second}, {time.Hour, 36 * time.Second}, {24 * time.Hour, time.Minute},
	} {
		r := &Relay{cfg: Config{Retention: c.retention}}
		if got := r.pruneEvery(); got != c.want {
			t.Errorf("retention %v: prune every %v, want %v", c.retention, got, c.want)
		}
	}
}
