package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// leading is a Leader whose Run goroutine the test controls.
type leading struct {
	l    *Leader
	r    *Relay
	stop context.CancelFunc
	done chan error
}

func startLeader(t *testing.T, s *outbox.Store, brokers []string, holder string, ttl time.Duration) *leading {
	t.Helper()
	cfg := testConfig(t, brokers)
	r, err := New(s, cfg)
	testutil.Must(t, err)
	l := NewLeader(r, s, holder, ttl, cfg.Logger)
	ctx, cancel := context.WithCancel(context.Background())
	ld := &leading{l: l, r: r, stop: cancel, done: make(chan error, 1)}
	go func() { ld.done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ld.done; err != nil {
			t.Errorf("leader %s: %v", holder, err)
		}
	})
	return ld
}

// waitLeading waits until ld holds the lease and its relay has published
// through id.
func (ld *leading) waitLeading(t *testing.T, id int64) {
	t.Helper()
	wait(t, 30*time.Second, func() error {
		st := ld.r.Status()
		if ld.l.Term() == 0 || st.LastPublishedID < id {
			return fmt.Errorf("term %d, published through %d, want %d (state %s, error %q)", ld.l.Term(),
				st.LastPublishedID, id, st.State, st.LastError)
		}
		return nil
	})
}

// TestLeader_Failover: two servers' relays on one PostgreSQL database. The
// leader stops renewing its lease, as a paused process does, and its relay
// goes on; once the lease expires the other takes it with the next term,
// its InitProducerID fences the old relay (which then waits for the lease),
// and every output is read once on read_committed.
func TestLeader_Failover(t *testing.T) {
	db := pgtest.New(t)
	c := newCluster(t)
	brokers := c.ListenAddrs()
	a := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	b := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	const ttl = 1500 * time.Millisecond

	ids := emit(t, a, "f", keyed("orders", 200, 5, 0)...)
	la := startLeader(t, a, brokers, "a", ttl)
	la.waitLeading(t, ids[len(ids)-1])
	lb := startLeader(t, b, brokers, "b", ttl)
	ls, err := b.Leases(context.Background())
	testutil.Must(t, err)
	if len(ls) != 1 || ls[0].Holder != "a" || ls[0].Term != la.l.Term() {
		t.Fatalf("leases %+v, want the relay's held by a at term %d", ls, la.l.Term())
	}
	first := la.l.Term()

	la.l.paused.Store(true)
	ids = append(ids, emit(t, b, "f", keyed("orders", 200, 5, 200)...)...)
	lb.waitLeading(t, ids[len(ids)-1])
	if lb.l.Term() != first+1 {
		t.Fatalf("b took the lease at term %d, want %d", lb.l.Term(), first+1)
	}
	ids = append(ids, emit(t, a, "f", keyed("orders", 200, 5, 400)...)...)
	lb.waitLeading(t, ids[len(ids)-1])
	// The old leader's relay met the new producer epoch and stopped: it
	// waits for the lease, which b holds.
	wait(t, 30*time.Second, func() error {
		if term := la.l.Term(); term != 0 {
			return fmt.Errorf("a still leads at term %d", term)
		}
		return nil
	})
	exactlyOnce(t, readCommitted(t, brokers, "orders"), ids)
}
