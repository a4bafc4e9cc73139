package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
)

func cluster(t *testing.T) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// txn writes values in one transaction of an independent franz-go
// producer, committed or aborted.
func txn(t *testing.T, brokers []string, id string, commit bool, values ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(id), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

func newClient(t *testing.T, brokers []string) *kafka.Client {
	t.Helper()
	c, err := kafka.New(brokers, "test", kafkasec.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// readAll fetches [0, end) at level and returns the values and markers it
// saw ("C" commit, "A" abort), in offset order.
func readAll(t *testing.T, c *kafka.Client, leader int32, end int64, level sarama.IsolationLevel) []string {
	t.Helper()
	var got []string
	for from := int64(0); from < end; {
		f, err := c.Fetch(context.Background(), "t", 0, leader, from, level)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range f.Records {
			switch {
			case r.Control && len(r.Key) >= 4 && r.Key[3] == 1:
				got = append(got, fmt.Sprintf("%d:C", r.Offset))
			case r.Control:
				got = append(got, fmt.Sprintf("%d:A", r.Offset))
			default:
				got = append(got, fmt.Sprintf("%d:%s", r.Offset, r.Value))
			}
		}
		if f.Next <= from {
			t.Fatalf("fetch at %d moved to %d", from, f.Next)
		}
		from = f.Next
	}
	return got
}

// A read_committed fetch leaves out the aborted transaction's records and
// keeps the markers; read_uncommitted keeps everything; the offsets
// listed are the log's start, its end and its last stable offset.
func TestClient_FetchAndOffsets(t *testing.T) {
	brokers := cluster(t)
	txn(t, brokers, "a", true, "a1", "a2")
	txn(t, brokers, "b", false, "b1")
	txn(t, brokers, "a", true, "a3")
	c := newClient(t, brokers)
	ctx := context.Background()
	md, err := c.Metadata(ctx, []string{"t", "missing"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if md["t"].Err != sarama.ErrNoError || len(md["t"].Partitions) != 1 || md["missing"].Err != sarama.ErrUnknownTopicOrPartition {
		t.Fatalf("metadata: %+v", md)
	}
	leader := md["t"].Partitions[0].Leader
	for _, c2 := range []struct {
		at    int64
		level sarama.IsolationLevel
		want  int64
	}{{kafka.Earliest, sarama.ReadUncommitted, 0}, {kafka.Latest, sarama.ReadUncommitted, 7}, {kafka.Latest, sarama.ReadCommitted, 7}} {
		got, err := c.ListOffset(ctx, "t", 0, leader, c2.at, c2.level)
		if err != nil || got != c2.want {
			t.Fatalf("ListOffset(%d, %v) = %d, %v; want %d", c2.at, c2.level, got, err, c2.want)
		}
	}
	committed := fmt.Sprint(readAll(t, c, leader, 7, sarama.ReadCommitted))
	if want := "[0:a1 1:a2 2:C 4:A 5:a3 6:C]"; committed != want {
		t.Fatalf("read_committed: %s, want %s", committed, want)
	}
	all := fmt.Sprint(readAll(t, c, leader, 7, sarama.ReadUncommitted))
	if want := "[0:a1 1:a2 2:C 3:b1 4:A 5:a3 6:C]"; all != want {
		t.Fatalf("read_uncommitted: %s, want %s", all, want)
	}
}

// Topics are created with their settings, an existing one is refused as
// such, and the settings read back.
func TestClient_CreateTopics(t *testing.T) {
	c := newClient(t, cluster(t))
	ctx := context.Background()
	compact := "compact"
	res, err := c.CreateTopics(ctx, kafka.TopicSpec{Partitions: 3, Replication: 1,
		Configs: map[string]*string{"cleanup.policy": &compact}}, "new", "t")
	if err != nil {
		t.Fatal(err)
	}
	if res["new"].Err != sarama.ErrNoError || res["t"].Err != sarama.ErrTopicAlreadyExists {
		t.Fatalf("create: %+v", res)
	}
	md, err := c.Metadata(ctx, []string{"new"}, false)
	if err != nil || len(md["new"].Partitions) != 3 {
		t.Fatalf("metadata of new: %+v, %v", md, err)
	}
	cfg, err := c.TopicConfigs(ctx, "new")
	if err != nil || cfg["cleanup.policy"] != "compact" {
		t.Fatalf("configs of new: %v, %v", cfg, err)
	}
}

// A call whose context ends while the broker does not answer returns the
// context's error, not a request timeout's.
func TestClient_ContextEndsACall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts and never answers
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	c := newClient(t, []string{ln.Addr().String()})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Metadata(ctx, []string{"t"}, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("metadata of a silent broker: %v, want the context's deadline", err)
	}
}
