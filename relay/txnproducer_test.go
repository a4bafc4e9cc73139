package relay

import (
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestTxnProducer_ManyBrokers: three brokers lead the partitions of two
// topics, a partition's rows of one transaction take several record
// batches (the smallest --max-message-bytes), and some rows have no key.
// Every row reaches Kafka exactly once, a key's rows in one partition, the
// one the Java client picks, in id order.
func TestTxnProducer_ManyBrokers(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(3))
	brokers := c.ListenAddrs()
	parts := map[string]int32{"t": 6, "u": 3}
	for topic, n := range parts {
		if err := c.CreateTopic(topic, n, nil); err != nil {
			t.Fatal(err)
		}
	}
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.Batch = 500
	cfg.MaxMessageBytes = outbox.MinMessageBytes
	var rows []row
	for i := range 1500 {
		r := row{topic: "t", key: []byte("k" + strconv.Itoa(i%37)), value: []byte(fmt.Sprintf("v%05d-%040d", i, i))}
		switch {
		case i%5 == 0:
			r.topic = "u"
		case i%11 == 0:
			r.key = nil
		}
		rows = append(rows, r)
	}
	want := map[string][]int64{}
	var ids []int64
	for start := 0; start < len(rows); start += 300 {
		ids = append(ids, emit(t, s, "f", rows[start:start+300]...)...)
	}
	for i, id := range ids {
		want[rows[i].topic] = append(want[rows[i].topic], id)
	}
	var batches atomic.Int32 // sent in produce requests, a partition's each
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			batches.Add(int32(len(rt.Partitions)))
		}
		return nil, nil, false
	})
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])
	for topic, n := range parts {
		recs := readCommitted(t, brokers, topic)
		exactlyOnce(t, recs, want[topic])
		checkKeyOrder(t, recs)
		for _, r := range recs {
			if r.Key == nil {
				continue
			}
			if p := javaPartition(r.Key, n); r.Partition != p {
				t.Errorf("%s key %q in partition %d, the Java client's is %d", topic, r.Key, r.Partition, p)
			}
		}
	}
	st := rr.r.Status()
	if st.Transactions < 3 || st.LastError != "" {
		t.Errorf("status %+v, want 3 or more transactions and no error", st)
	}
	// A transaction touches at most 10 partitions (the progress topic's
	// one with them): more batches than that means some partition's rows
	// took several.
	if n := batches.Load(); n <= int32(10*st.Transactions) {
		t.Errorf("%d batches in %d transactions: no partition took more than one", n, st.Transactions)
	}
}

// TestTxnProducer_RetriableRefusals: a leader answers NOT_LEADER_OR_FOLLOWER
// for a while and the coordinator CONCURRENT_TRANSACTIONS (it writes the
// last transaction's markers); the producer sends the same batches again
// within the transaction, and nothing is published twice or lost.
func TestTxnProducer_RetriableRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		key  kmsg.Key
		code int16
	}{
		{"NotLeader", kmsg.Produce, kerr.NotLeaderForPartition.Code},
		{"NotEnoughReplicas", kmsg.Produce, kerr.NotEnoughReplicas.Code},
		{"ConcurrentTransactions", kmsg.AddPartitionsToTxn, kerr.ConcurrentTransactions.Code},
		{"CoordinatorLoading", kmsg.EndTxn, kerr.CoordinatorLoadInProgress.Code},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := newCluster(t)
			brokers := cl.ListenAddrs()
			s := outboxtest.TempStore(t)
			ids := emit(t, s, "f", keyed("t", 40, 4, 0)...)
			rr := startRelay(t, s, testConfig(t, brokers))
			rr.waitPublished(t, ids[len(ids)-1])

			var refused atomic.Int32
			cl.ControlKey(int16(c.key), func(req kmsg.Request) (kmsg.Response, error, bool) {
				if refused.Add(1) > 3 {
					cl.DropControl()
					return nil, nil, false
				}
				cl.KeepControl()
				return refusal(req, c.code), nil, true
			})
			ids = append(ids, emit(t, s, "f", keyed("t", 40, 4, 40)...)...)
			rr.waitPublished(t, ids[len(ids)-1])
			if n := refused.Load(); n < 4 {
				t.Fatalf("%d requests seen, want the 3 refused and one more", n)
			}
			exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
			// Retried within the transaction: no session ended.
			if st := rr.r.Status(); st.LastError != "" || st.Transactions != 2 {
				t.Errorf("status %+v, want 2 transactions and no error", st)
			}
		})
	}
}

// TestTxnProducer_PipelinedRefusal: a transaction whose partitions take
// several record batches each sends its produce requests one after the
// other without waiting for the answers. The leader refuses the first
// (NOT_LEADER_OR_FOLLOWER), so it refuses the partitions' later batches
// as out of order; the producer sends them all again in order, within
// the transaction, and every row is published once, a key's in id order.
func TestTxnProducer_PipelinedRefusal(t *testing.T) {
	cl := newCluster(t)
	brokers := cl.ListenAddrs()
	if err := cl.CreateTopic("t", 3, nil); err != nil {
		t.Fatal(err)
	}
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.Batch = 1000
	cfg.MaxMessageBytes = outbox.MinMessageBytes
	ids := emit(t, s, "f", keyed("t", 40, 4, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])

	var requests, refused atomic.Int32
	cl.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cl.KeepControl()
		if requests.Add(1) == 1 {
			refused.Add(1)
			return refusal(req, kerr.NotLeaderForPartition.Code), nil, true
		}
		return nil, nil, false
	})
	var rows []row
	for i := range 600 {
		rows = append(rows, row{topic: "t", key: []byte("k" + strconv.Itoa(i%7)), value: []byte(fmt.Sprintf("v%05d-%0200d", i, i))})
	}
	ids = append(ids, emit(t, s, "f", rows...)...)
	rr.waitPublished(t, ids[len(ids)-1])
	if n := requests.Load(); refused.Load() != 1 || n < 4 {
		t.Fatalf("%d produce requests, %d refused: want one refused and the transaction's in several requests", n, refused.Load())
	}
	recs := readCommitted(t, brokers, "t")
	exactlyOnce(t, recs, ids)
	checkKeyOrder(t, recs)
	if st := rr.r.Status(); st.LastError != "" || st.Transactions != 2 {
		t.Errorf("status %+v, want 2 transactions and no error (the refusal retried within the second)", st)
	}
}

// refusal answers req with code for every partition (or the request).
func refusal(req kmsg.Request, code int16) kmsg.Response {
	switch r := req.(type) {
	case *kmsg.ProduceRequest:
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp
	case *kmsg.AddPartitionsToTxnRequest:
		resp := r.ResponseKind().(*kmsg.AddPartitionsToTxnResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewAddPartitionsToTxnResponseTopic()
			st.Topic = rt.Topic
			for _, p := range rt.Partitions {
				sp := kmsg.NewAddPartitionsToTxnResponseTopicPartition()
				sp.Partition, sp.ErrorCode = p, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp
	case *kmsg.EndTxnRequest:
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = code
		return resp
	}
	panic(fmt.Sprintf("no refusal for %T", req))
}

// TestTxnProducer_ProduceFailsThenFenced: a produce refused with a code
// that is not retriable ends the session; the next producer fences the
// transaction, which never commits, and its rows go out once.
func TestTxnProducer_ProduceFailsThenFenced(t *testing.T) {
	cl := newCluster(t)
	brokers := cl.ListenAddrs()
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("t", 40, 4, 0)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	var seen atomic.Int32
	cl.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		seen.Add(1)
		return refusal(req, kerr.InvalidRecord.Code), nil, true
	})
	ids = append(ids, emit(t, s, "f", keyed("t", 40, 4, 40)...)...)
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	if n := seen.Load(); n != 1 {
		t.Errorf("%d produce requests refused, want 1", n)
	}
}

func TestNextSequence(t *testing.T) {
	for _, c := range []struct{ seq, n, want int32 }{
		{0, 1, 1},
		{0, 4000, 4000},
		{math.MaxInt32 - 10, 10, math.MaxInt32},
		{math.MaxInt32 - 10, 11, 0},
		{math.MaxInt32 - 10, 15, 4},
		{math.MaxInt32, 1, 0},
	} {
		if got := nextSequence(c.seq, c.n); got != c.want {
			t.Errorf("nextSequence(%d, %d) = %d, want %d", c.seq, c.n, got, c.want)
		}
	}
}

// TestTxnProducer_DuplicateOnFirstSend: a broker answers a batch
// DUPLICATE_SEQUENCE_NUMBER without writing it, on its first send or on
// its send after a refusal that wrote nothing (NOT_LEADER_OR_FOLLOWER). A
// batch not written before cannot be a duplicate: the session ends, the
// transaction never commits, and the next session publishes its rows once.
func TestTxnProducer_DuplicateOnFirstSend(t *testing.T) {
	for _, before := range []int16{0, kerr.NotLeaderForPartition.Code} {
		t.Run(map[int16]string{0: "FirstSend", kerr.NotLeaderForPartition.Code: "AfterNotLeader"}[before], func(t *testing.T) {
			cl := newCluster(t)
			brokers := cl.ListenAddrs()
			s := outboxtest.TempStore(t)
			ids := emit(t, s, "f", keyed("t", 40, 4, 0)...)
			rr := startRelay(t, s, testConfig(t, brokers))
			rr.waitPublished(t, ids[len(ids)-1])
			var answered atomic.Int32
			cl.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				n := answered.Add(1)
				if before != 0 && n == 1 {
					cl.KeepControl()
					return refusal(req, before), nil, true
				}
				cl.DropControl()
				return refusal(req, kerr.DuplicateSequenceNumber.Code), nil, true
			})
			// One transaction's rows, and nothing after them that a broker
			// could find out of sequence.
			ids = append(ids, emit(t, s, "f", keyed("t", 60, 6, 40)...)...)
			rr.waitPublished(t, ids[len(ids)-1])
			exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
			if n, want := answered.Load(), int32(1+min(before, 1)); n != want {
				t.Errorf("%d produce requests answered by the test, want %d", n, want)
			}
			if st := rr.r.Status(); st.PublishedTotal != 100 {
				t.Errorf("published %d rows, want 100: %+v", st.PublishedTotal, st)
			}
		})
	}
}
