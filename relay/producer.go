package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/outbox"
)

// saramaConfig is the producer configuration: idempotent, acks=all, one
// request in flight per broker (which keeps per-partition order across
// retries), keys partitioned like the Java client. A non-empty txnID makes
// it transactional.
func saramaConfig(c Config, txnID string) *sarama.Config {
	sc := sarama.NewConfig()
	sc.ClientID = "outboxd-relay"
	sc.Version = sarama.V3_6_0_0
	sc.ChannelBufferSize = 1024
	sc.Net.MaxOpenRequests = 1
	sc.Net.DialTimeout = 5 * time.Second
	sc.Net.ReadTimeout = 15 * time.Second
	sc.Net.WriteTimeout = 5 * time.Second
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
	// A transactional producer's CommitTxn waits for every record of the
	// transaction and refuses to commit when one failed, so exactly-once
	// needs no per-record success: sarama then skips a channel send per
	// record, and the relay a receive. Failures still come back one by one
	// (Return.Errors), so a batch fails at its first refused record. The
	// idempotent producer has no commit: it waits for each success.
	sc.Producer.Return.Successes = txnID == ""
	sc.Producer.Return.Errors = true
	sc.Producer.Retry.Max = 5
	sc.Producer.Retry.Backoff = 100 * time.Millisecond
	sc.Producer.Timeout = 10 * time.Second
	// Sarama bounds each partition's batch by this, counting each record
	// at most outbox.RecordBytes: the batch a broker measures is then
	// within c.MaxMessageBytes (see fits).
	sc.Producer.MaxMessageBytes = c.MaxMessageBytes - outbox.RecordBatchOverhead
	// LZ4: the cheapest codec to encode, and the one that saves the most
	// work where most of it is, in moving and storing the bytes. Measured
	// end to end (file -> Kafka, 1 KiB lines): 26.0 CPU us a line without
	// compression, 16.1 with LZ4, 16.4 with Snappy; for 13-byte lines no
	// difference. Every broker since 0.10 takes it, and consumers
	// decompress without being told. Records are still measured against
	// MaxMessageBytes uncompressed (see fits), so a batch that fits
	// uncompressed fits compressed.
	sc.Producer.Compression = sarama.CompressionLZ4
	c.Kafka.Sarama(sc)
	if txnID != "" {
		sc.Producer.Transaction.ID = txnID
		sc.Producer.Transaction.Timeout = c.TransactionTimeout
		sc.Producer.Transaction.Retry.Max = 5
		sc.Producer.Transaction.Retry.Backoff = 50 * time.Millisecond
	}
	return sc
}

// producer is a sarama AsyncProducer that sends a batch and waits for every
// record's outcome: an idempotent one by each record's success, a
// transactional one by its commit. Collectors drain the Successes (when
// they are returned) and Errors channels for the producer's whole life, so
// sending never blocks on them.
type producer struct {
	ap         sarama.AsyncProducer
	collectors sync.WaitGroup
	// acked is true when sarama returns each record's success, so sendAll
	// waits for them; false for a transactional producer, whose commit
	// waits.
	acked bool
	// idempotent is true for a producer without transactions, whose records
	// of a failed batch may still land (see settled).
	idempotent bool
	txnID      string // "" for an idempotent producer
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

// newProducer connects. A transactional producer also initialises its
// producer id here (InitProducerID), which fences any earlier producer with
// the same transactional id and ends its open transaction.
func newProducer(brokers []string, sc *sarama.Config, principal string) (*producer, error) {
	txnID := sc.Producer.Transaction.ID
	ap, err := sarama.NewAsyncProducer(brokers, sc)
	if err != nil {
		// Initialising a producer id needs Write on the transactional id,
		// or, for an idempotent producer, IdempotentWrite on the cluster
		// (or Write on some topic).
		return nil, denied(err, principal, ask("Write", ResourceTransactionalID, txnID),
			ask("IdempotentWrite", ResourceCluster, clusterName))
	}
	p := &producer{ap: ap, acked: sc.Producer.Return.Successes, idempotent: txnID == "", txnID: txnID, principal: principal}
	if p.acked {
		p.collectors.Go(func() {
			for m := range ap.Successes() {
				if b, ok := m.Metadata.(*pending); ok {
					b.finish(nil)
				}
			}
		})
	}
	p.collectors.Add(1)
	go func() {
		defer p.collectors.Done()
		for e := range ap.Errors() {
			if b, ok := e.Msg.Metadata.(*pending); ok {
				b.finish(p.denied(e.Err, e.Msg.Topic))
			}
		}
	}()
	return p, nil
}

// denied explains a refusal of a record to topic: Write on the topic, or
// on the transactional id (adding a partition to the transaction).
func (p *producer) denied(err error, topic string) error {
	return denied(err, p.principal, ask("Write", ResourceTopic, topic), ask("Write", ResourceTransactionalID, p.txnID))
}

// openProducer is newProducer bounded by ctx: sarama's own retries can
// take a while when Kafka is down. A producer that arrives after ctx is
// done is closed.
func openProducer(ctx context.Context, brokers []string, sc *sarama.Config, principal string) (*producer, error) {
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
		go func() {
			if o := <-ch; o.p != nil {
				o.p.close()
			}
		}()
		return nil, ctx.Err()
	}
}

// sendAll sends msgs in order and waits until each has succeeded, or
// returns at the first failure: the batch has failed, and waiting for
// sarama to give up on the rest can take long while Kafka is away. The
// records still in flight belong to a producer that is about to be
// dropped (and, for a transactional one, fenced). ctx bounds the wait.
func (p *producer) sendAll(ctx context.Context, msgs []*sarama.ProducerMessage) error {
	_, err := p.send(ctx, msgs)
	return err
}

// send is sendAll, and returns the batch's outcomes as they come. A
// producer that is not acked returns once every record is handed to
// sarama (or at the first failure): its commit waits for the rest.
func (p *producer) send(ctx context.Context, msgs []*sarama.ProducerMessage) (*pending, error) {
	b := newPending(len(msgs))
	if len(msgs) == 0 {
		return b, nil
	}
	for i, m := range msgs {
		m.Metadata = b
		select {
		case p.ap.Input() <- m:
		case <-b.failed:
			b.abandon(len(msgs) - i)
			return b, p.settled(ctx, b)
		case <-ctx.Done():
			return b, fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
		}
	}
	if !p.acked {
		return b, b.result()
	}
	select {
	case <-b.done:
		return b, b.result()
	case <-b.failed:
		return b, p.settled(ctx, b)
	case <-ctx.Done():
		return b, fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
	}
}

// abandon counts n records that were never sent as settled.
func (b *pending) abandon(n int) {
	for range n {
		b.finish(nil)
	}
}

// settled returns the first failure of b. When an idempotent producer's
// failure is a record too large, it first waits (within ctx) for every
// record of b to have its outcome: the relay then sends the same rows again
// in halves, and no record of this attempt may land among them. A
// transactional producer is replaced after such a failure (its transaction
// aborted by the fencing), and any other failure ends the producer, so
// nothing is waited for.
func (p *producer) settled(ctx context.Context, b *pending) error {
	err := b.result()
	if !p.idempotent || !isTooLarge(err) {
		return err
	}
	select {
	case <-b.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
	}
}

// publishTxn sends msgs in one transaction and commits it. A commit that
// fails is ambiguous (*ambiguousError), unless a record of the transaction
// failed: sarama then refuses to commit without asking the coordinator.
// When a record fails, the transaction cannot commit; it is left to the
// next producer's initialisation to abort, except after an error that may
// mean "fenced", where an abort makes the coordinator say so.
func (p *producer) publishTxn(ctx context.Context, msgs []*sarama.ProducerMessage) error {
	if err := p.ap.BeginTxn(); err != nil {
		return denied(fmt.Errorf("begin transaction: %w", err), p.principal, ask("Write", ResourceTransactionalID, p.txnID))
	}
	b, err := p.send(ctx, msgs)
	if err == nil {
		err = blocking(ctx, p.ap.CommitTxn)
		if rerr := b.result(); err != nil && rerr != nil {
			err = rerr // a record failed: the commit was never sent
		} else if err != nil {
			return p.commitFailed(err)
		}
	}
	if err != nil {
		err = fmt.Errorf("produce: %w", err)
		if Classify(err) == Ambiguous {
			return p.abort(ctx, err)
		}
		return err
	}
	return nil
}

// commitFailed is the error of a commit that failed with err.
func (p *producer) commitFailed(err error) error {
	err = fmt.Errorf("commit transaction: %w", err)
	if isUnauthorized(err) {
		// Refused: the transaction did not commit (the next producer's
		// initialisation aborts it), and no retry commits it.
		return denied(err, p.principal, ask("Write", ResourceTransactionalID, p.txnID))
	}
	return &ambiguousError{err}
}

// abortTimeout bounds the abort made to learn whether the producer is fenced.
const abortTimeout = 3 * time.Second

// abort asks the coordinator to abort the transaction; its answer tells a
// fenced producer (PRODUCER_FENCED) from one whose records merely failed.
func (p *producer) abort(ctx context.Context, cause error) error {
	if ctx.Err() != nil {
		return cause
	}
	ctx, cancel := context.WithTimeout(ctx, abortTimeout)
	defer cancel()
	if err := blocking(ctx, p.ap.AbortTxn); err != nil {
		return errors.Join(cause, fmt.Errorf("abort transaction: %w", err))
	}
	return cause
}

// close shuts the producer down, waiting for records in flight, and
// returns once both collectors have drained.
func (p *producer) close() {
	p.ap.AsyncClose()
	p.collectors.Wait()
}

// blocking runs f, which cannot be interrupted, and returns its error, or
// errAbandoned when ctx is done first (f goes on in the background).
func blocking(ctx context.Context, f func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
	}
}

// ProducerConfig is the sarama configuration the relay's producer runs
// with for c, transactional when txnID is not empty. A tool that must
// produce exactly as the relay does (the bench's raw producer) starts from
// it instead of a copy.
func ProducerConfig(c Config, txnID string) *sarama.Config { return saramaConfig(c, txnID) }
