package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/relay"
)

// endMarker is the value of the records appended to every partition of a
// topic once its producer has stopped: a consumer that has read up to them
// has read everything.
const endMarker = "__outboxd_bench_end__"

// kafkaClientID is the client id of the bench's own Kafka clients.
const kafkaClientID = "outboxd-bench"

// topicPartitions is the partition count of the bench's topics: the relay's
// default for the topics it creates.
var topicPartitions = relay.DefaultConfig().TopicPartitions

// kafkaClient returns a client of the run's brokers, the product's own
// (internal/kafka, on sarama). Each user has its own, so that a
// consumer's waiting fetches hold up no other request.
func (b *bench) kafkaClient() (*kafka.Client, error) {
	cl, err := kafka.New(b.brokers, kafkaClientID, kafkasec.Settings{})
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// createTopics creates the run's topics up front, so that no consumer waits
// for a topic to appear.
func (b *bench) createTopics(ctx context.Context, topics ...string) error {
	cl, err := b.kafkaClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	spec := kafka.TopicSpec{Partitions: topicPartitions, Replication: relay.DefaultConfig().TopicReplication}
	resp, err := cl.CreateTopics(ctx, spec, topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	for _, t := range topics {
		r, ok := resp[t]
		switch {
		case !ok:
			return fmt.Errorf("create topic %s: no answer for it", t)
		case r.Err != sarama.ErrNoError:
			return fmt.Errorf("create topic %s: %w %s", t, r.Err, r.Message)
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
	cl, err := b.kafkaClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := cl.DeleteTopics(ctx, topics...)
	if err != nil {
		return err
	}
	for _, t := range topics {
		if code, ok := resp[t]; ok && code != sarama.ErrNoError && code != sarama.ErrUnknownTopicOrPartition {
			return fmt.Errorf("delete topic %s: %w", t, code)
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
	cl, err := b.kafkaClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	msgs := make([]kafka.Message, topicPartitions)
	for p := range msgs {
		msgs[p] = kafka.Message{Topic: topic, Partition: int32(p), Value: []byte(endMarker)}
	}
	if err := cl.Produce(ctx, msgs); err != nil {
		return fmt.Errorf("mark the ends of %s: %w", topic, err)
	}
	return nil
}

// startConsumer reads topic with read_committed from its start, handing
// every record and the time its fetch arrived to each, on the task's
// goroutine, until the task is stopped.
func (b *bench) startConsumer(ctx context.Context, topic string, failed chan<- error,
	each func(r *kafka.Record, at time.Time)) (*task, error) {
	cl, err := b.kafkaClient()
	if err != nil {
		return nil, fmt.Errorf("consumer of %s: %w", topic, err)
	}
	return startTask(ctx, "consumer of "+topic, failed, func(ctx context.Context) error {
		defer cl.Close()
		return cl.Consume(ctx, topic, sarama.ReadCommitted, func(_ int32, r *kafka.Record, at time.Time) { each(r, at) })
	}), nil
}
