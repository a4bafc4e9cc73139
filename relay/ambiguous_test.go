package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestRelay_CommitAppliedButUnanswered: the coordinator commits, the answer
// is lost and Kafka stays away until sarama gives up, so CommitTxn fails.
// The relay must not guess: a new producer and the progress topic say the
// batch is in, and it is not published again.
func TestRelay_CommitAppliedButUnanswered(t *testing.T) {
	c, p := proxiedCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	rr := startRelay(t, s, testConfig(t, brokers))
	ids := emit(t, s, "f", keyed("t", 30, 3, 0)...)
	rr.waitPublished(t, ids[len(ids)-1])

	c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		p.swallowNextAnswer() // the commit goes through; its answer does not
		// Once only: a function that does not handle the request stays
		// registered, and the new producer's EndTxn would cut the proxy
		// again after restore, for good.
		c.DropControl()
		return nil, nil, false
	})
	ids = append(ids, emit(t, s, "f", keyed("t", 30, 3, 30)...)...)
	// The error text is overwritten by the next attempt's within
	// milliseconds (the proxy is still down); the count of ambiguous
	// outcomes stays.
	waitErrors(t, rr, Ambiguous)
	p.restore()
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	if st := rr.r.Status(); st.PublishedTotal != 30 {
		// This Run counts the first batch; the second one it learned
		// about from Kafka's progress, it did not publish it twice.
		t.Errorf("published %d rows, want 30: %+v", st.PublishedTotal, st)
	}
}

// TestRelay_CommitRefused: the coordinator keeps failing the commit, which
// never happens. A new producer aborts the transaction and the batch is
// published again, once.
func TestRelay_CommitRefused(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	rr := startRelay(t, s, testConfig(t, brokers))
	ids := emit(t, s, "f", keyed("t", 30, 3, 0)...)
	rr.waitPublished(t, ids[len(ids)-1])

	refusals := 0
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if refusals++; refusals > 12 { // two sessions' worth of retries
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		resp := req.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
		return resp, nil, true
	})
	ids = append(ids, emit(t, s, "f", keyed("t", 30, 3, 30)...)...)
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
}

// waitErrors waits until the relay has counted an error of class c.
func waitErrors(t *testing.T, rr *running, c Class) {
	t.Helper()
	wait(t, 15*time.Second, func() error {
		if st := rr.r.Status(); st.Errors[c.String()] == 0 {
			return fmt.Errorf("state %s, errors %v, last %q", st.State, st.Errors, st.LastError)
		}
		return nil
	})
}
