package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// faultRun is one fault scenario: a relay publishes 40 rows, then fault
// is installed (and before, when set, before the relay starts) and 60
// more rows are emitted. Every row must be read once with read_committed;
// sessions is the number of InitProducerID requests the relay may make in
// all (0: any).
type faultRun struct {
	name     string
	brokers  int
	before   func(t *testing.T, c *kfake.Cluster)
	fault    func(t *testing.T, c *kfake.Cluster)
	config   func(cfg *Config)
	sessions int32
	// uncommitted also reads with read_uncommitted: a batch written twice,
	// or written after its transaction ended, would show there.
	uncommitted bool
	opts        []kfake.Opt // of the cluster
}

func (f faultRun) run(t *testing.T) {
	c := newCluster(t, append([]kfake.Opt{kfake.NumBrokers(max(f.brokers, 1))}, f.opts...)...)
	brokers := c.ListenAddrs()
	var inits atomic.Int32
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		inits.Add(1)
		return nil, nil, false
	})
	if f.before != nil {
		f.before(t, c)
	}
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	if f.config != nil {
		f.config(&cfg)
	}
	ids := emit(t, s, "f", keyed("t", 40, 4, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])
	f.fault(t, c)
	ids = append(ids, emit(t, s, "f", keyed("t", 60, 6, 40)...)...)
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	if f.uncommitted {
		exactlyOnce(t, readCommitted(t, brokers, "t", kgo.FetchIsolationLevel(kgo.ReadUncommitted())), ids)
	}
	if n := inits.Load(); f.sessions > 0 && n != f.sessions {
		t.Errorf("%d InitProducerID requests, want %d", n, f.sessions)
	}
}

// produceFault fails count produce requests with code.
func produceFault(code *kerr.Error, count int) func(*testing.T, *kfake.Cluster) {
	return func(_ *testing.T, c *kfake.Cluster) {
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t", Err: code, Count: count})
	}
}

// TestRelay_ProduceFaults: a broker's answers to a produce that the
// relay must read right. A batch written but answered REQUEST_TIMED_OUT or
// NOT_ENOUGH_REPLICAS_AFTER_APPEND is sent again and kept once, in the
// same session; a sequence or producer state the broker does not share
// (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH,
// INVALID_TXN_STATE) ends the session, whose next one publishes the rows.
func TestRelay_ProduceFaults(t *testing.T) {
	for _, f := range produceFaults() {
		t.Run(f.name, f.run)
	}
}

func produceFaults() []faultRun {
	return []faultRun{
		{name: "RequestTimedOutAfterAppend", fault: produceFault(kerr.RequestTimedOut, 1), sessions: 1, uncommitted: true},
		{name: "NotEnoughReplicasAfterAppend", fault: produceFault(kerr.NotEnoughReplicasAfterAppend, 1), sessions: 1,
			uncommitted: true},
		{name: "OutOfOrderSequence", fault: produceFault(kerr.OutOfOrderSequenceNumber, 1), sessions: 2},
		{name: "UnknownProducerID", fault: produceFault(kerr.UnknownProducerID, 1), sessions: 2},
		{name: "InvalidProducerEpoch", fault: produceFault(kerr.InvalidProducerEpoch, 1), sessions: 2},
		{name: "InvalidTxnState", fault: produceFault(kerr.InvalidTxnState, 1), sessions: 2},
	}
}

// TestRelay_CoordinatorFaults: a coordinator busy with the last
// transaction's markers (CONCURRENT_TRANSACTIONS) on InitProducerID and on
// EndTxn is asked again; one that moves during EndTxn is looked up again.
// No session ends.
func TestRelay_CoordinatorFaults(t *testing.T) {
	for _, f := range coordinatorFaults() {
		t.Run(f.name, f.run)
	}
}

func coordinatorFaults() []faultRun {
	busy := func(key kmsg.Key) func(*testing.T, *kfake.Cluster) {
		return func(_ *testing.T, c *kfake.Cluster) {
			c.Fault(kfake.Fault{Keys: []kmsg.Key{key}, TopLevel: true, Err: kerr.ConcurrentTransactions, Count: 3})
		}
	}
	return []faultRun{
		{name: "ConcurrentTransactionsOnInit", before: busy(kmsg.InitProducerID), fault: func(*testing.T, *kfake.Cluster) {},
			sessions: 4}, // the three refused and the one answered
		{name: "ConcurrentTransactionsOnEndTxn", fault: busy(kmsg.EndTxn), sessions: 1},
		{name: "CoordinatorMovesDuringEndTxn", brokers: 3, sessions: 1, fault: func(_ *testing.T, c *kfake.Cluster) {
			c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.RehashCoordinators()
				resp := req.ResponseKind().(*kmsg.EndTxnResponse)
				resp.ErrorCode = kerr.NotCoordinator.Code
				return resp, nil, true
			})
		}},
	}
}

// TestRelay_Kafka28: the produce and coordinator faults against a
// cluster that speaks no request version newer than Kafka 2.8's. (The
// whole suite runs so with RELAY_TEST_KAFKA=2.8.)
func TestRelay_Kafka28(t *testing.T) {
	for _, f := range append(produceFaults(), coordinatorFaults()...) {
		f.opts = append(f.opts, kfake.MaxVersions(kversion.V2_8_0()))
		t.Run(f.name, f.run)
	}
	t.Run("Versions", func(t *testing.T) {
		c := newCluster(t, kfake.MaxVersions(kversion.V2_8_0()))
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(context.Background(), cl)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range resp.ApiKeys {
			if k.ApiKey == int16(kmsg.Produce) && k.MaxVersion != 9 {
				t.Errorf("the capped cluster takes produce v%d, Kafka 2.8's is v9", k.MaxVersion)
			}
		}
	})
}

// TestRelay_LostProduceResponse: a batch is written and its answer lost
// with the connection. The relay sends it again on a new connection, the
// broker keeps the one copy it has, and the session goes on.
func TestRelay_LostProduceResponse(t *testing.T) {
	c, p := proxiedCluster(t)
	brokers := c.ListenAddrs()
	var inits atomic.Int32
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		inits.Add(1)
		return nil, nil, false
	})
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("t", 40, 4, 0)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	var swallowed atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		p.swallowNextAnswer() // written; the answer cuts the connection
		swallowed.Store(true)
		c.DropControl()
		return nil, nil, false
	})
	ids = append(ids, emit(t, s, "f", keyed("t", 60, 6, 40)...)...)
	wait(t, 10*time.Second, func() error {
		if !swallowed.Load() || !p.isDown() {
			return errors.New("the produce answer not swallowed yet")
		}
		return nil
	})
	// While no broker answers, the status says the relay is not
	// connected and sends again.
	wait(t, 10*time.Second, func() error {
		if st := rr.r.Status(); st.Connected || !strings.Contains(st.LastError, "sending again: produce to broker") {
			return fmt.Errorf("status %+v, want not connected, sending again", st)
		}
		return nil
	})
	p.restore()
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	exactlyOnce(t, readCommitted(t, brokers, "t", kgo.FetchIsolationLevel(kgo.ReadUncommitted())), ids)
	if st := rr.r.Status(); !st.Connected || st.LastError != "" {
		t.Errorf("status %+v after the batch went out, want connected and no error", st)
	}
	if n := inits.Load(); n != 1 {
		t.Errorf("%d InitProducerID requests, want 1: the lost answer ended the session", n)
	}
}

// TestRelay_StallPastTransactionTimeout: every produce stalls past the
// transaction timeout (the coordinator aborts the transaction meanwhile).
// The relay's delivery timeout, below the transaction timeout, ends the
// session with the produces in doubt, never ending the transaction with
// its epoch; the stalled batches, answered later, are refused, and the
// next session publishes every row once.
func TestRelay_StallPastTransactionTimeout(t *testing.T) {
	var stallUntil atomic.Int64
	f := faultRun{
		name:        "Stall",
		uncommitted: true,
		config: func(cfg *Config) {
			cfg.TransactionTimeout = 2 * time.Second
			cfg.DeliveryTimeout = 1500 * time.Millisecond
			cfg.RequestTimeout = time.Second
		},
		fault: func(_ *testing.T, c *kfake.Cluster) {
			stallUntil.Store(time.Now().Add(3 * time.Second).UnixNano())
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				if d := time.Until(time.Unix(0, stallUntil.Load())); d > 0 {
					c.SleepControl(func() { <-time.After(d) })
				}
				return nil, nil, false
			})
		},
	}
	f.run(t)
}
