package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestTxnProducer_InDoubtProduce: in one round broker A answers a produce
// UNKNOWN_SERVER_ERROR while broker H holds its produce past the relay's
// request timeout. The transaction must not be ended with the producer's
// epoch while H may still write that batch (a broker without partition
// verification would append it after the abort marker, into a transaction
// its coordinator does not know); the next session's InitProducerID ends
// it. H's batch, let go after that, is refused: the log holds each row
// once, read_committed and read_uncommitted alike.
func TestTxnProducer_InDoubtProduce(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(3))
	brokers := c.ListenAddrs()
	const txnID = "outboxd-in-doubt"
	coord := c.CoordinatorFor(txnID)
	held, refusing := (coord+1)%3, (coord+2)%3
	if err := c.CreateTopic("t", 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic(DefaultProgressTopic, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
		t.Fatal(err)
	}
	for p, node := range []int32{refusing, held, refusing} {
		if err := c.MoveTopicPartition("t", int32(p), node); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.MoveTopicPartition(DefaultProgressTopic, 0, coord); err != nil {
		t.Fatal(err)
	}
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.TransactionalID = txnID
	cfg.RequestTimeout = time.Second
	ids := emit(t, s, "f", keyed("t", 30, 6, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])

	var (
		holding   atomic.Bool
		refused   atomic.Bool // the first produce of the next transaction that reaches the refusing broker
		heldEpoch atomic.Int32
		heldReq   atomic.Pointer[kmsg.ProduceRequest]
		release   = make(chan struct{})
		inits     atomic.Int32
		mu        sync.Mutex
		ended     []string // EndTxn requests with the held batch's epoch while it was held
	)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		pr := req.(*kmsg.ProduceRequest)
		switch c.CurrentNode() {
		case refusing:
			if !refused.CompareAndSwap(false, true) {
				c.KeepControl()
				return nil, nil, false
			}
			c.KeepControl()
			return refusal(req, kerr.UnknownServerError.Code), nil, true
		case held:
			if heldReq.Load() != nil || !heldReq.CompareAndSwap(nil, pr) {
				c.KeepControl()
				return nil, nil, false
			}
			heldEpoch.Store(int32(batchEpoch(t, pr)))
			holding.Store(true)
			c.SleepControl(func() { <-release })
			holding.Store(false)
			c.DropControl()
			return nil, nil, false // written now, if the broker takes it
		}
		c.KeepControl()
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.EndTxnRequest)
		if holding.Load() && int32(r.ProducerEpoch) == heldEpoch.Load() {
			mu.Lock()
			ended = append(ended, map[bool]string{true: "commit", false: "abort"}[r.Commit])
			mu.Unlock()
		}
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if holding.Load() {
			inits.Add(1)
		}
		return nil, nil, false
	})
	// The held batch answered: an observing fault sees it handled.
	answered := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Nodes: []int32{held}, Observe: true, Count: -1,
		When: func(req kmsg.Request) bool { return req == kmsg.Request(heldReq.Load()) }})

	more := emit(t, s, "f", keyed("t", 30, 6, 30)...)
	ids = append(ids, more...)
	// The next session publishes the rows while H still holds the batch.
	rr.waitPublished(t, ids[len(ids)-1])
	if heldReq.Load() == nil {
		t.Fatal("no produce reached the broker that holds one")
	}
	if n := inits.Load(); n < 1 {
		t.Errorf("no InitProducerID while the batch was held: the session did not start over")
	}
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := answered.Wait(ctx, 1); err != nil {
		t.Fatalf("the held batch was never handled: %v", err)
	}
	mu.Lock()
	if len(ended) > 0 {
		t.Errorf("EndTxn %v sent with epoch %d while that epoch's batch was in doubt", ended, heldEpoch.Load())
	}
	mu.Unlock()
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	// The held batch was refused, not appended as an open or aborted
	// transaction's records.
	exactlyOnce(t, readCommitted(t, brokers, "t", kgo.FetchIsolationLevel(kgo.ReadUncommitted())), ids)
}

// batchEpoch returns the producer epoch of req's first record batch.
func batchEpoch(t *testing.T, req *kmsg.ProduceRequest) int16 {
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(rp.Records); err != nil {
				t.Errorf("read a produced batch: %v", err)
				return -1
			}
			return b.ProducerEpoch
		}
	}
	return -1
}
