package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// Message is a record to produce outside any transaction.
type Message struct {
	Topic string
	// Partition is the partition it goes to; ByKey: the one its key
	// hashes to (sarama's hash partitioner), so that the messages of one
	// key share a partition and keep their order.
	Partition  int32
	Key, Value []byte
}

// ByKey is the Partition of a Message that goes where its key hashes to.
const ByKey int32 = -1

// produceLinger is how long the producer waits to fill a batch.
const produceLinger = 5 * time.Millisecond

// Produce sends msgs outside any transaction, in order within a
// partition, each acknowledged by every in-sync replica, on connections
// of its own with the client's settings. It returns once all are
// acknowledged, or the first failure after sarama's retries. When ctx is
// done first, its connections are cut, which fails what is in flight, and
// it returns ctx's error; no goroutine outlives the call.
func (c *Client) Produce(ctx context.Context, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	conf := c.produceConfig()
	conns := NewDialer(conf.Net.DialTimeout)
	conns.Use(conf)
	done := make(chan error, 1)
	go func() { done <- c.produce(conf, msgs) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		conns.CutAll()
		<-done
		return ctx.Err()
	}
}

// produceConfig is the client's configuration for a producer: acks from
// every in-sync replica, a short linger, each message's own partition or
// its key's.
func (c *Client) produceConfig() *sarama.Config {
	conf := *c.conf
	conf.Producer.RequiredAcks = sarama.WaitForAll
	conf.Producer.Return.Successes = true
	conf.Producer.Return.Errors = true
	conf.Producer.Flush.Frequency = produceLinger
	conf.Producer.Partitioner = func(topic string) sarama.Partitioner {
		return keyOrOwn{byKey: sarama.NewHashPartitioner(topic)}
	}
	return &conf
}

// produce sends msgs with a synchronous producer of conf.
func (c *Client) produce(conf *sarama.Config, msgs []Message) error {
	addrs := make([]string, len(c.seeds))
	for i, b := range c.seeds {
		addrs[i] = b.Addr()
	}
	p, err := sarama.NewSyncProducer(addrs, conf)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	pms := make([]*sarama.ProducerMessage, len(msgs))
	for i, m := range msgs {
		pms[i] = &sarama.ProducerMessage{Topic: m.Topic, Partition: m.Partition, Value: sarama.ByteEncoder(m.Value)}
		if m.Key != nil {
			pms[i].Key = sarama.ByteEncoder(m.Key)
		}
	}
	err = p.SendMessages(pms)
	cerr := p.Close()
	var perrs sarama.ProducerErrors
	if errors.As(err, &perrs) && len(perrs) > 0 {
		m := perrs[0].Msg
		return fmt.Errorf("produce to %s[%d]: %w (%d messages failed)", m.Topic, m.Partition, perrs[0].Err, len(perrs))
	}
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("close the producer: %w", cerr)
	}
	return nil
}

// keyOrOwn sends a message to its own Partition, or where its key hashes
// to when that is ByKey.
type keyOrOwn struct{ byKey sarama.Partitioner }

func (k keyOrOwn) Partition(m *sarama.ProducerMessage, n int32) (int32, error) {
	if m.Partition == ByKey {
		return k.byKey.Partition(m, n)
	}
	return m.Partition, nil
}

// RequiresConsistency is true: a message's partition never changes.
func (keyOrOwn) RequiresConsistency() bool { return true }
