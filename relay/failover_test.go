package relay

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// failoverCluster is a three-broker cluster with topic t (3 partitions)
// and the progress topic, the progress and t/1, t/2 led by the
// transaction coordinator's broker and t/0 by another one (old), with the
// third (next) free to take t/0 over. It counts the relay's
// InitProducerID requests, one per session.
type failoverCluster struct {
	c               *kfake.Cluster
	coord, old, nxt int32
	inits           atomic.Int32
}

func newFailoverCluster(t *testing.T, txnID string) *failoverCluster {
	t.Helper()
	c := newCluster(t, kfake.NumBrokers(3))
	f := &failoverCluster{c: c, coord: c.CoordinatorFor(txnID)}
	f.old, f.nxt = (f.coord+1)%3, (f.coord+2)%3
	if err := c.CreateTopic("t", 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic(DefaultProgressTopic, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
		t.Fatal(err)
	}
	for tp, node := range map[topicPartition]int32{
		{"t", 0}: f.old, {"t", 1}: f.coord, {"t", 2}: f.coord, {DefaultProgressTopic, 0}: f.coord,
	} {
		if err := c.MoveTopicPartition(tp.topic, tp.partition, node); err != nil {
			t.Fatal(err)
		}
	}
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		f.inits.Add(1)
		return nil, nil, false
	})
	return f
}

// firstSequences returns the first sequence of each batch req holds for
// topic/partition.
func firstSequences(req *kmsg.ProduceRequest, topic string, partition int32) []int32 {
	var seqs []int32
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			if rt.Topic != topic || rp.Partition != partition {
				continue
			}
			var b kmsg.RecordBatch
			if b.ReadFrom(rp.Records) == nil {
				seqs = append(seqs, b.FirstSequence)
			}
		}
	}
	return seqs
}

// TestRelay_LeaderFailover: mid-transaction, t/0's leader answers
// NOT_LEADER_OR_FOLLOWER for three seconds (a real failover takes
// seconds: KRaft's broker session timeout is 9s) before another broker
// takes t/0 over. The batch is sent again, with the same sequence, until
// the new leader writes it: the session goes on (one InitProducerID in
// all, no error), and every row is read once.
func TestRelay_LeaderFailover(t *testing.T) {
	const txnID = "outboxd-failover"
	f := newFailoverCluster(t, txnID)
	c := f.c
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.TransactionalID = txnID
	ids := emit(t, s, "f", keyed("t", 60, 6, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])

	const failover = 3 * time.Second
	var (
		mu       sync.Mutex
		refused  []int32 // first sequences of t/0's batches the old leader refused
		accepted []int32 // and of those the new leader took
		moved    atomic.Bool
		started  sync.Once
	)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		seqs := firstSequences(pr, "t", 0)
		if len(seqs) == 0 {
			return nil, nil, false
		}
		switch node := c.CurrentNode(); {
		case node == f.old && !moved.Load():
			started.Do(func() {
				time.AfterFunc(failover, func() {
					if err := c.MoveTopicPartition("t", 0, f.nxt); err != nil {
						t.Error(err)
					}
					moved.Store(true)
				})
			})
			mu.Lock()
			refused = append(refused, seqs...)
			mu.Unlock()
			return refusal(req, kerr.NotLeaderForPartition.Code), nil, true
		case node == f.nxt:
			mu.Lock()
			accepted = append(accepted, seqs...)
			mu.Unlock()
		}
		return nil, nil, false
	})
	ids = append(ids, emit(t, s, "f", keyed("t", 60, 6, 60)...)...)
	// Meanwhile the status says what the relay retries.
	wait(t, 10*time.Second, func() error {
		if st := rr.r.Status(); !strings.Contains(st.LastError, "sending again: produce to t/0") || !st.Connected {
			return fmt.Errorf("status %+v, want connected and an error saying t/0 is sent again", st)
		}
		return nil
	})
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	mu.Lock()
	defer mu.Unlock()
	if len(refused) < 3 || len(accepted) == 0 || accepted[0] != refused[0] {
		t.Errorf("t/0's first sequences refused %v, then accepted %v: want several refusals, then the same sequence", refused, accepted)
	}
	for _, seq := range refused {
		if seq != refused[0] {
			t.Errorf("t/0's first sequences refused %v: want the one batch sent again", refused)
			break
		}
	}
	if n := f.inits.Load(); n != 1 {
		t.Errorf("%d InitProducerID requests, want 1: the failover ended the session", n)
	}
	if st := rr.r.Status(); st.LastError != "" || st.Transactions != 2 {
		t.Errorf("status %+v, want 2 transactions and no error", st)
	}
}
