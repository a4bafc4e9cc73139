package relay

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// claimed opens a store on path and claims the database.
func claimed(t *testing.T, path string) *outbox.Store {
	t.Helper()
	s := outboxtest.StoreAt(t, path)
	if _, err := s.Claim(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitRunDone waits for rr's Run to return and returns its error.
func waitRunDone(t *testing.T, rr *running, what string) error {
	t.Helper()
	select {
	case err := <-rr.done:
		rr.once.Do(func() { rr.err = err })
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not stop: %+v", what, rr.r.Status())
		return nil
	}
}

// TestRelay_FencedWhileOwner: a relay whose store still owns the database
// is fenced by another producer with its transactional id (a process that
// lost the claim, on its way out). It must start over with a new producer,
// not stop; the other one, whose store never claimed, stops; every row is
// published exactly once.
func TestRelay_FencedWhileOwner(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	path := filepath.Join(t.TempDir(), "outboxd.db")
	owner := claimed(t, path)
	ids := emit(t, owner, "f", keyed("t", 60, 6, 0)...)
	rr := startRelay(t, owner, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])

	zombie := startRelay(t, outboxtest.StoreAt(t, path), testConfig(t, brokers))
	wait(t, 10*time.Second, func() error {
		if st := zombie.r.Status(); !st.Connected {
			return fmt.Errorf("the other relay %s: %s", st.State, st.LastError)
		}
		return nil
	})
	// Rows keep coming: the owner's relay, fenced, starts over and fences
	// the other in turn, which stops at its next transaction.
	wait(t, 20*time.Second, func() error {
		ids = append(ids, emit(t, owner, "f", keyed("t", 20, 6, len(ids))...)...)
		select {
		case err := <-zombie.done:
			zombie.once.Do(func() { zombie.err = err })
			if !errors.Is(err, ErrFenced) {
				t.Fatalf("the other relay's Run returned %v, want ErrFenced", err)
			}
			return nil
		default:
			return fmt.Errorf("the other relay still runs: %+v", zombie.r.Status())
		}
	})
	ids = append(ids, emit(t, owner, "f", keyed("t", 20, 6, len(ids))...)...)
	rr.waitPublished(t, ids[len(ids)-1])
	if st := rr.r.Status(); st.Fenced || st.State == StateFenced {
		t.Fatalf("the owner's relay status %+v: it must have started over", st)
	}
	select {
	case err := <-rr.done:
		t.Fatalf("the owner's relay stopped: %v", err)
	default:
	}
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
}

// TestRelay_FencedAfterLosingClaim: once another process claimed the
// database, a relay fenced by that process's relay stops with ErrFenced
// (and outbox.ErrFenced), while the new owner's relay publishes
// everything exactly once.
func TestRelay_FencedAfterLosingClaim(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	path := filepath.Join(t.TempDir(), "outboxd.db")
	older := claimed(t, path)
	ids := emit(t, older, "f", keyed("t", 40, 4, 0)...)
	old := startRelay(t, older, testConfig(t, brokers))
	old.waitPublished(t, ids[len(ids)-1])

	newer := claimed(t, path)
	cur := startRelay(t, newer, testConfig(t, brokers))
	for i := range 5 {
		ids = append(ids, emit(t, newer, "f", keyed("t", 20, 4, 40+20*i)...)...)
	}
	err := waitRunDone(t, old, "the relay of the store that lost its claim")
	if !errors.Is(err, ErrFenced) || !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("its Run returned %v, want ErrFenced and outbox.ErrFenced", err)
	}
	cur.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
}

// TestRelay_NoProducerWithoutTheClaim: a relay whose store lost its claim
// before Run never makes a producer (whose initialisation would fence the
// owner's): Run ends with ErrFenced and the broker saw no InitProducerID.
func TestRelay_NoProducerWithoutTheClaim(t *testing.T) {
	c := newCluster(t)
	var inits atomic.Int64
	c.ControlKey(kmsg.InitProducerID.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		inits.Add(1)
		return nil, nil, false // counted, then handled as usual
	})
	path := filepath.Join(t.TempDir(), "outboxd.db")
	older := claimed(t, path)
	emit(t, older, "f", keyed("t", 10, 2, 0)...)
	claimed(t, path)
	for _, mode := range []Mode{ModeExactlyOnce, ModeAtLeastOnce} {
		cfg := testConfig(t, c.ListenAddrs())
		cfg.Mode = mode
		rr := startRelay(t, older, cfg)
		err := waitRunDone(t, rr, string(mode)+" relay")
		if !errors.Is(err, ErrFenced) || !errors.Is(err, outbox.ErrFenced) {
			t.Fatalf("%s: Run returned %v, want ErrFenced and outbox.ErrFenced", mode, err)
		}
	}
	if n := inits.Load(); n != 0 {
		t.Fatalf("%d InitProducerID requests from a relay whose store lost the claim, want 0", n)
	}
}
