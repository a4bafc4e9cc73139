package relay

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// saramaConfig is the producers' configuration: idempotent, acks=all, one
// request in flight per broker for sarama's own producer (which keeps
// per-partition order across retries; the exactly-once producer's client
// keeps up to maxInFlight, see clientConfig), keys partitioned like the
// Java client. A non-empty txnID makes
// it transactional: the exactly-once relay's txnProducer reads its
// settings (batch limit, compression, acks, timeouts, retries,
// partitioner) and sends its requests itself; the at-least-once relay's
// is sarama's AsyncProducer.
func saramaConfig(c Config, txnID string) *sarama.Config {
	sc := kafkaclient.Config("outboxd-relay", c.Kafka) // version, TLS, SASL
	sc.ChannelBufferSize = 1024
	sc.Net.MaxOpenRequests = 1
	sc.Net.ReadTimeout = c.RequestTimeout
	// Topics are created on purpose (kafka.ensureTopics), never by a
	// metadata request.
	sc.Metadata.AllowAutoTopicCreation = false
	sc.Metadata.Full = false
	// Sarama's retries nest (a transaction request retries, each retry
	// looks up the coordinator with its own retries): keep each level
	// short so a failure surfaces within about a second. The relay's own
	// loop retries after that.
	sc.Metadata.Retry.Max = 1
	sc.Metadata.Retry.Backoff = 50 * time.Millisecond
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner
	// The idempotent producer has no commit: it waits for each success.
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	// The at-least-once producer's resends fill about the delivery
	// timeout, as the exactly-once producer's do (see
	// txnProducer.produce): a failover takes seconds.
	sc.Producer.Retry.Backoff = 100 * time.Millisecond
	sc.Producer.Retry.Max = resendsWithin(c.DeliveryTimeout, sc.Producer.Retry.Backoff)
	sc.Producer.Retry.BackoffFunc = func(retries, _ int) time.Duration {
		return resendBackoff(retries, sc.Producer.Retry.Backoff)
	}
	// The broker answers a produce within this (acks from the
	// replicas or REQUEST_TIMED_OUT), before the relay stops waiting.
	sc.Producer.Timeout = c.RequestTimeout * 2 / 3
	// Each partition's batch is bounded by this, counting each record
	// at most outbox.RecordBytes: the batch a broker measures is then
	// within c.MaxMessageBytes (see fits).
	sc.Producer.MaxMessageBytes = c.MaxMessageBytes - outbox.RecordBatchOverhead
	// LZ4: the cheapest codec to encode, and the one that saves the most
	// work where most of it is, in moving and storing the bytes (figures:
	// docs/performance.md). Every broker since 0.10 takes it, and consumers
	// decompress without being told. Records are still measured against
	// MaxMessageBytes uncompressed (see fits), so a batch that fits
	// uncompressed fits compressed.
	sc.Producer.Compression = sarama.CompressionLZ4
	if txnID != "" {
		sc.Producer.Transaction.ID = txnID
		sc.Producer.Transaction.Timeout = c.TransactionTimeout
		sc.Producer.Transaction.Retry.Max = 5
		sc.Producer.Transaction.Retry.Backoff = 50 * time.Millisecond
	}
	return sc
}

// resendBackoff is the wait before the retries'th resend of a batch: from
// base, doubling, up to produceMaxBackoff.
func resendBackoff(retries int, base time.Duration) time.Duration {
	wait := base
	for range retries {
		if wait >= produceMaxBackoff {
			return produceMaxBackoff
		}
		wait *= 2
	}
	return min(wait, produceMaxBackoff)
}

// resendsWithin is the number of resends whose backoffs (resendBackoff)
// add up to d, at least one.
func resendsWithin(d, base time.Duration) int {
	n := 0
	for total := time.Duration(0); total < d && n < 10_000; n++ {
		total += resendBackoff(n, base)
	}
	return max(n, 1)
}

// producer is the at-least-once relay's: a sarama idempotent
// AsyncProducer that sends a batch and waits for each record's success.
// Collectors drain the Successes and Errors channels for the producer's
// whole life, so sending never blocks on them.
type producer struct {
	ap         sarama.AsyncProducer
	collectors sync.WaitGroup
	principal  string // who the brokers' ACLs see, for *AuthorizationError
}

// pending tracks the records of one batch still waiting for an outcome.
type pending struct {
	left   atomic.Int64
	done   chan struct{} // closed when every record has an outcome
	failed chan struct{} // closed at the first failure
	mu     sync.Mutex
	err    error // the first failure
}

func newPending(n int) *pending {
	b := &pending{done: make(chan struct{}), failed: make(chan struct{})}
	b.left.Store(int64(n))
	return b
}

func (b *pending) finish(err error) {
	if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
			close(b.failed)
		}
		b.mu.Unlock()
	}
	if b.left.Add(-1) == 0 {
		close(b.done)
	}
}

func (b *pending) result() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// abandon counts n records that were never sent as settled.
func (b *pending) abandon(n int) {
	for range n {
		b.finish(nil)
	}
}

// newProducer connects and initialises an idempotent producer id.
func newProducer(brokers []string, sc *sarama.Config, principal string) (*producer, error) {
	ap, err := sarama.NewAsyncProducer(brokers, sc)
	if err != nil {
		// Initialising a producer id needs IdempotentWrite on the
		// cluster (or Write on some topic).
		return nil, denied(err, principal, ask("IdempotentWrite", ResourceCluster, clusterName))
	}
	p := &producer{ap: ap, principal: principal}
	p.collectors.Go(func() {
		for m := range ap.Successes() {
			if b, ok := m.Metadata.(*pending); ok {
				b.finish(nil)
			}
		}
	})
	p.collectors.Go(func() {
		for e := range ap.Errors() {
			if b, ok := e.Msg.Metadata.(*pending); ok {
				b.finish(denied(e.Err, p.principal, ask("Write", ResourceTopic, e.Msg.Topic)))
			}
		}
	})
	return p, nil
}

// openProducer is newProducer bounded by ctx: sarama's own retries can
// take a while when Kafka is down. When ctx is done first, the opening's
// connections are cut, it is waited for, and a producer it made is
// closed.
func openProducer(ctx context.Context, brokers []string, sc *sarama.Config, principal string) (*producer, error) {
	d := kafkaclient.NewDialer(sc.Net.DialTimeout)
	d.Use(sc)
	type opened struct {
		p   *producer
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		p, err := newProducer(brokers, sc, principal)
		ch <- opened{p, err}
	}()
	select {
	case o := <-ch:
		return o.p, o.err
	case <-ctx.Done():
		d.CutAll()
		if o := <-ch; o.p != nil {
			o.p.close()
		}
		return nil, ctx.Err()
	}
}

// sendAll sends msgs in order and waits until each has succeeded, or
// returns at the first failure: the batch has failed, and waiting for
// sarama to give up on the rest can take long while Kafka is away. The
// records still in flight belong to a producer that is about to be
// dropped; a record too large is waited for (see settled). ctx bounds the
// wait.
func (p *producer) sendAll(ctx context.Context, msgs []*sarama.ProducerMessage) error {
	b := newPending(len(msgs))
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		m.Metadata = b
		select {
		case p.ap.Input() <- m:
		case <-b.failed:
			b.abandon(len(msgs) - i)
			return p.settled(ctx, b)
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
		}
	}
	select {
	case <-b.done:
		return b.result()
	case <-b.failed:
		return p.settled(ctx, b)
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
	}
}

// settled returns the first failure of b. When it is a record too large,
// it first waits (within ctx) for every record of b to have its outcome:
// the relay then sends the same rows again in halves, and no record of this
// attempt may land among them. Any other failure ends the producer, so
// nothing is waited for.
func (p *producer) settled(ctx context.Context, b *pending) error {
	err := b.result()
	if !isTooLarge(err) {
		return err
	}
	select {
	case <-b.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
	}
}

// close shuts the producer down, waiting for records in flight, and
// returns once both collectors have drained.
func (p *producer) close() {
	p.ap.AsyncClose()
	p.collectors.Wait()
}
