package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/testutil"
)

// consumer runs Consume of topic at level on a goroutine and keeps what
// it hands over, by partition.
type consumer struct {
	mu     sync.Mutex
	got    map[int32][]string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func consume(t *testing.T, c *kafka.Client, topic string, level sarama.IsolationLevel) *consumer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cs := &consumer{got: map[int32][]string{}, cancel: cancel, done: make(chan error, 1)}
	go func() {
		cs.done <- c.Consume(ctx, topic, level, func(p int32, r *kafka.Record, _ time.Time) {
			cs.mu.Lock()
			defer cs.mu.Unlock()
			cs.got[p] = append(cs.got[p], string(r.Key)+"="+string(r.Value))
		})
	}()
	t.Cleanup(func() { _ = cs.stop() })
	return cs
}

// stop ends Consume and returns what it returned.
func (cs *consumer) stop() error {
	cs.once.Do(func() {
		cs.cancel()
		cs.err = <-cs.done
	})
	return cs.err
}

// waitEnds waits until every one of n partitions handed over a last
// record whose value is "end", and returns what they handed over.
func (cs *consumer) waitEnds(t *testing.T, n int) map[int32][]string {
	t.Helper()
	testutil.Wait(t, 30*time.Second, func() error {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		for p := range int32(n) {
			if l := cs.got[p]; len(l) == 0 || l[len(l)-1] != "=end" {
				return fmt.Errorf("partition %d: %v", p, l)
			}
		}
		return nil
	})
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.got
}

// Consume hands over a read_committed topic's committed records, in
// offset order, without the aborted transaction's or the markers; a
// cancelled Consume returns nil.
func TestClient_ConsumeReadCommitted(t *testing.T) {
	brokers := cluster(t)
	txn(t, brokers, "a", true, "a1", "a2")
	txn(t, brokers, "b", false, "b1")
	txn(t, brokers, "a", true, "a3")
	c := newClient(t, brokers)
	if err := c.Produce(context.Background(), []kafka.Message{{Topic: "t", Value: []byte("end")}}); err != nil {
		t.Fatal(err)
	}
	cs := consume(t, c, "t", sarama.ReadCommitted)
	got := fmt.Sprint(cs.waitEnds(t, 1))
	if want := "map[0:[k=a1 k=a2 k=a3 =end]]"; got != want {
		t.Fatalf("consumed %s, want %s", got, want)
	}
	if err := cs.stop(); err != nil {
		t.Fatalf("Consume after its context ended: %v", err)
	}
}

// Produce sends each message to its own partition or, ByKey, to its key's
// (all of one key to one partition, in order); Consume reads every
// partition of a topic created after it began.
func TestClient_ProduceAndConsumePartitions(t *testing.T) {
	c := newClient(t, cluster(t))
	ctx := context.Background()
	cs := consume(t, c, "later", sarama.ReadUncommitted) // the topic does not exist yet
	res, err := c.CreateTopics(ctx, kafka.TopicSpec{Partitions: 3, Replication: 1}, "later")
	if err != nil || res["later"].Err != sarama.ErrNoError {
		t.Fatalf("create: %+v, %v", res, err)
	}
	var msgs []kafka.Message
	for i := range 4 {
		msgs = append(msgs, kafka.Message{Topic: "later", Partition: kafka.ByKey, Key: []byte("k"), Value: []byte(fmt.Sprint(i))})
	}
	for p := range int32(3) {
		msgs = append(msgs, kafka.Message{Topic: "later", Partition: p, Value: []byte(fmt.Sprint("p", p))},
			kafka.Message{Topic: "later", Partition: p, Value: []byte("end")})
	}
	if err := c.Produce(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	got := cs.waitEnds(t, 3)
	keyed := 0
	for p := range int32(3) {
		own := []string{fmt.Sprint("=p", p), "=end"}
		if l := got[p]; len(l) == 6 {
			keyed++
			if want := append([]string{"k=0", "k=1", "k=2", "k=3"}, own...); !slices.Equal(l, want) {
				t.Errorf("partition %d: %v, want %v", p, l, want)
			}
		} else if !slices.Equal(l, own) {
			t.Errorf("partition %d: %v, want %v", p, l, own)
		}
	}
	if keyed != 1 {
		t.Errorf("the keyed messages went to %d partitions, want 1: %v", keyed, got)
	}
}

// DeleteTopics deletes a topic and answers a missing one as such.
func TestClient_DeleteTopics(t *testing.T) {
	c := newClient(t, cluster(t))
	ctx := context.Background()
	if _, err := c.CreateTopics(ctx, kafka.TopicSpec{Partitions: 1, Replication: 1}, "gone"); err != nil {
		t.Fatal(err)
	}
	res, err := c.DeleteTopics(ctx, "gone", "missing")
	if err != nil {
		t.Fatal(err)
	}
	if res["gone"] != sarama.ErrNoError || res["missing"] != sarama.ErrUnknownTopicOrPartition || len(res) != 2 {
		t.Fatalf("delete: %v", res)
	}
	md, err := c.Metadata(ctx, []string{"gone"}, false)
	if err != nil || md["gone"].Err != sarama.ErrUnknownTopicOrPartition {
		t.Fatalf("metadata of gone: %+v, %v", md, err)
	}
}

// A Produce whose context ends while the broker does not answer returns
// the context's error.
func TestClient_ProduceContextEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts and never answers
		var conns []net.Conn
		defer func() {
			for _, conn := range conns {
				_ = conn.Close()
			}
		}()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, conn)
		}
	}()
	c := newClient(t, []string{ln.Addr().String()})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = c.Produce(ctx, []kafka.Message{{Topic: "t", Value: []byte("v")}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("produce to a silent broker: %v, want the context's deadline", err)
	}
}

// A fetch whose answer fills its byte budget before every partition is
// in it (three partitions of 10 MiB against 16 MiB a response, 8 MiB a
// partition: the broker leaves the last partition out) is read on: each
// partition is handed over whole, in order.
func TestClient_ConsumePartitionsLeftOut(t *testing.T) {
	c := newClient(t, cluster(t))
	ctx := context.Background()
	if res, err := c.CreateTopics(ctx, kafka.TopicSpec{Partitions: 3, Replication: 1}, "big"); err != nil || res["big"].Err != sarama.ErrNoError {
		t.Fatalf("create: %+v, %v", res, err)
	}
	value := make([]byte, 100<<10)
	const perPartition = 100 // 10 MiB
	for p := range int32(3) {
		var msgs []kafka.Message
		for i := range perPartition {
			msgs = append(msgs, kafka.Message{Topic: "big", Partition: p, Key: []byte(fmt.Sprint(i)), Value: value})
		}
		msgs = append(msgs, kafka.Message{Topic: "big", Partition: p, Value: []byte("end")})
		if err := c.Produce(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	cs := consume(t, c, "big", sarama.ReadUncommitted)
	got := cs.waitEnds(t, 3)
	for p := range int32(3) {
		l := got[p]
		if len(l) != perPartition+1 {
			t.Fatalf("partition %d: %d records, want %d", p, len(l), perPartition+1)
		}
		for i, kv := range l[:perPartition] {
			if want := fmt.Sprint(i) + "=" + string(value); kv != want {
				t.Fatalf("partition %d record %d: key/value %.20q..., want key %d", p, i, kv, i)
			}
		}
	}
}
