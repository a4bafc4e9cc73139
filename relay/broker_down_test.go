package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestRelay_BrokerDownAndBack cuts every connection to the broker while
// ingest goes on filling the outbox. The relay backs off, recovers by
// itself when the broker is back (it stays away past the delivery
// timeout, so the session ends), and a read_committed consumer sees every
// row exactly once, in key order.
func TestRelay_BrokerDownAndBack(t *testing.T) {
	t.Run("WhileIdle", func(t *testing.T) {
		brokerDownRounds(t, ModeExactlyOnce, func(t *testing.T, rr *running, p *proxy, last int64) {
			rr.waitPublished(t, last)
			p.cut()
		})
	})
	t.Run("MidTransaction", func(t *testing.T) {
		brokerDownRounds(t, ModeExactlyOnce, cutWhilePublishing)
	})
	t.Run("AtLeastOnce", func(t *testing.T) {
		brokerDownRounds(t, ModeAtLeastOnce, cutWhilePublishing)
	})
}

type cutFunc func(t *testing.T, rr *running, p *proxy, last int64)

func brokerDownRounds(t *testing.T, mode Mode, cut cutFunc) {
	c, p := proxiedCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.Mode = mode
	cfg.Batch = 50
	// The broker stays away longer than the delivery timeout: the
	// session ends, and the next one starts when it is back.
	cfg.RequestTimeout = time.Second
	cfg.DeliveryTimeout = 2 * time.Second
	ids := emit(t, s, "f", keyed("t", 100, 5, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])

	for round := range 2 {
		ids = append(ids, emit(t, s, "f", keyed("t", 400, 5, len(ids))...)...)
		cut(t, rr, p, ids[len(ids)-1])
		ids = append(ids, emit(t, s, "f", keyed("t", 50, 5, len(ids))...)...)
		wait(t, 10*time.Second, func() error {
			st := rr.r.Status()
			if (st.State == StateBackingOff || st.State == StateStarting) && !st.Connected && st.LastError != "" {
				return nil
			}
			return fmt.Errorf("round %d: state %s, connected %v", round, st.State, st.Connected)
		})
		p.restore()
		rr.waitPublished(t, ids[len(ids)-1])
		if st := rr.r.Status(); !st.Connected || st.LastError != "" {
			t.Errorf("round %d: after recovery %+v", round, st)
		}
	}
	recs := readCommitted(t, brokers, "t")
	if mode == ModeExactlyOnce {
		exactlyOnce(t, recs, ids)
	} else {
		// Repeats are the at-least-once contract: check order on each
		// row's first copy.
		recs = firstCopies(t, recs)
		atLeastOnce(t, recs, ids)
	}
	checkKeyOrder(t, recs)
}

// cutWhilePublishing cuts the proxy as soon as the relay is in the middle
// of publishing rows before last.
func cutWhilePublishing(t *testing.T, rr *running, p *proxy, last int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st := rr.r.Status(); st.State == StatePublishing && st.LastPublishedID < last {
			p.cut()
			return
		}
		time.Sleep(time.Millisecond)
	}
	p.cut() // it published everything first: the next rows meet the cut
}

// atLeastOnce checks that every id in want is in recs.
func atLeastOnce(t *testing.T, recs []*kgo.Record, want []int64) {
	t.Helper()
	seen := map[int64]int{}
	for _, r := range recs {
		seen[idOf(t, r)]++
	}
	for _, id := range want {
		if seen[id] == 0 {
			t.Errorf("outbox row %d lost", id)
		}
	}
}

// firstCopies drops every record whose outboxd-id came before.
func firstCopies(t *testing.T, recs []*kgo.Record) []*kgo.Record {
	t.Helper()
	seen := map[int64]bool{}
	var first []*kgo.Record
	for _, r := range recs {
		if id := idOf(t, r); !seen[id] {
			seen[id] = true
			first = append(first, r)
		}
	}
	return first
}
