package kafkafeed_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/feedtest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
)

// newKafka starts an in-process broker, closed at the end of t.
func newKafka(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// produce writes values to partition p of topic, in order, with a client of
// its own (a topic may have been re-created since the last call).
func produce(t *testing.T, c *kfake.Cluster, topic string, p int32, values ...[]byte) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Partition: p, Key: []byte("k"), Value: v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func testKafkaConfig(t *testing.T, c *kfake.Cluster, topic string) kafkafeed.Config {
	return kafkafeed.Config{
		Brokers:         c.ListenAddrs(),
		Topic:           topic,
		Group:           "outboxd-test",
		MetadataRefresh: 50 * time.Millisecond,
		CommitInterval:  50 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

func TestFeed_Contract(t *testing.T) {
	c := newKafka(t)
	const topic = "contract"
	if err := c.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	feedtest.Run(t, feedtest.Harness{
		Name: "kafka",
		New: func(t *testing.T) ingest.Feed {
			return kafkafeed.New(testKafkaConfig(t, c, topic))
		},
		Append: func(t *testing.T, values ...[]byte) {
			t.Helper()
			produce(t, c, topic, 0, values...)
		},
		Replace: func(t *testing.T) {
			t.Helper()
			if err := c.DeleteTopic(topic); err != nil {
				t.Fatal(err)
			}
			if err := c.CreateTopic(topic, 1, nil); err != nil {
				t.Fatal(err)
			}
		},
	})
}
