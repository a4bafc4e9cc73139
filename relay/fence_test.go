package relay

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestRelay_SecondRelayFencesFirst: two relays on one database share the
// transactional id. The newer one's producer fences the older, which stops
// on its next transaction; every row still reaches Kafka exactly once.
func TestRelay_SecondRelayFencesFirst(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("t", 60, 6, 0)...)
	older := startRelay(t, s, testConfig(t, brokers))
	older.waitPublished(t, ids[len(ids)-1])

	newer := startRelay(t, s, testConfig(t, brokers))
	wait(t, 10*time.Second, func() error {
		if st := newer.r.Status(); !st.Connected {
			return fmt.Errorf("newer relay %s: %s", st.State, st.LastError)
		}
		return nil
	})
	// The older relay sees these rows as unpublished and tries a
	// transaction, which the coordinator refuses.
	for i := range 5 {
		ids = append(ids, emit(t, s, "f", keyed("t", 20, 6, 60+20*i)...)...)
	}
	select {
	case err := <-older.done:
		older.once.Do(func() { older.err = err })
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("older Run returned %v, want ErrFenced", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the older relay was not fenced: %+v", older.r.Status())
	}
	if st := older.r.Status(); !st.Fenced || st.State != StateFenced || st.LastError == "" {
		t.Errorf("older relay status %+v, want fenced with a reason", st)
	}
	newer.waitPublished(t, ids[len(ids)-1])
	if st := newer.r.Status(); st.Fenced || st.State == StateFenced {
		t.Errorf("newer relay status %+v, want not fenced", st)
	}
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
}
