package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/relay"
)

// endMarker is the value of the records appended to every partition of a
// topic once its producer has stopped: a consumer that has read up to them
// has read everything.
const endMarker = "__outboxd_bench_end__"

// topicPartitions is the partition count of the bench's topics: the relay's
// default for the topics it creates.
var topicPartitions = relay.DefaultConfig().TopicPartitions

// createTopics creates the run's topics up front, so that no consumer waits
// for a topic to appear.
func (b *bench) createTopics(ctx context.Context, topics ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		return fmt.Errorf("kafka admin client: %w", err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, topicPartitions, relay.DefaultConfig().TopicReplication, nil, topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	for _, r := range resp {
		if r.Err != nil {
			return fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
		}
	}
	b.topics = append(b.topics, topics...)
	return nil
}

// deleteTopics deletes topics, within a bound of its own (it also runs at
// the end of a run that was interrupted).
func (b *bench) deleteTopics(topics ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		return fmt.Errorf("kafka admin client: %w", err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).DeleteTopics(ctx, topics...)
	if err != nil {
		return fmt.Errorf("delete topics %v: %w", topics, err)
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("delete topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// doneWithTopic frees a dev broker's memory of a finished phase's topic.
// Topics on a real cluster are deleted at the end of the run instead.
func (b *bench) doneWithTopic(topic string) {
	if b.broker == nil {
		return
	}
	if err := b.deleteTopics(topic); err != nil {
		b.say("%v", err)
	}
}

// markEnds appends an end marker to every partition of topic, outside any
// transaction.
func (b *bench) markEnds(ctx context.Context, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	for p := range topicPartitions {
		r := &kgo.Record{Topic: topic, Partition: p, Value: []byte(endMarker)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			return fmt.Errorf("mark the end of %s[%d]: %w", topic, p, err)
		}
	}
	return nil
}

// startConsumer reads topic with read_committed from its start, handing
// every record and the time its fetch arrived to each, on the task's
// goroutine, until the task is stopped.
func (b *bench) startConsumer(ctx context.Context, topic string, failed chan<- error,
	each func(r *kgo.Record, at time.Time)) (*task, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(b.brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		return nil, fmt.Errorf("consumer of %s: %w", topic, err)
	}
	return startTask(ctx, "consumer of "+topic, failed, func(ctx context.Context) error {
		defer cl.Close()
		return consumeEach(ctx, cl, each)
	}), nil
}

// consumeEach polls until ctx is done or a fetch fails for good.
func consumeEach(ctx context.Context, cl *kgo.Client, each func(*kgo.Record, time.Time)) error {
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fatalFetchError(fs); err != nil {
			return err
		}
		at := time.Now()
		fs.EachRecord(func(r *kgo.Record) { each(r, at) })
	}
}

// fatalFetchError is the first fetch error worth stopping for: the client
// retries retriable ones by itself.
func fatalFetchError(fs kgo.Fetches) error {
	for _, fe := range fs.Errors() {
		if errors.Is(fe.Err, context.Canceled) || kerr.IsRetriable(fe.Err) {
			continue
		}
		return fmt.Errorf("fetch %s[%d]: %w", fe.Topic, fe.Partition, fe.Err)
	}
	return nil
}
