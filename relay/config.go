package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/relaystatus"
	"github.com/outboxd/outboxd/outbox"
)

// Mode is how the relay publishes (Config.Mode, Status.Mode): the shared
// vocabulary of internal/relaystatus.
type Mode = relaystatus.Mode

// Modes accepted by Config.Mode.
const (
	// ModeExactlyOnce publishes each batch of rows in a Kafka transaction
	// together with the relay's progress: a read_committed consumer sees
	// every row exactly once, across any crash.
	ModeExactlyOnce = relaystatus.ModeExactlyOnce
	// ModeAtLeastOnce publishes with an idempotent producer and marks rows
	// published after the ack: a crash repeats at most the batch in flight.
	// For brokers without transactions.
	ModeAtLeastOnce = relaystatus.ModeAtLeastOnce
)

// Timestamps accepted by Config.Timestamp.
const (
	// TimestampPublish stamps each record with the time the relay makes
	// its batch: a backlog published after an outage is as new as it is
	// to Kafka, so the topic's retention counts from its publishing and a
	// broker's log.message.timestamp.before.max.ms takes it.
	TimestampPublish = "publish"
	// TimestampCreated stamps each record with its outbox row's creation
	// (the commit of the item that produced it): the same on every copy,
	// and the item's time for a consumer. A backlog older than a topic's
	// retention may be deleted soon after it lands, and one a broker
	// refuses as too old (INVALID_TIMESTAMP) becomes dead letters
	// (ReasonOutputInvalidTimestamp).
	TimestampCreated = "created"
)

// DefaultProgressTopic is the compacted topic that holds exactly-once progress.
const DefaultProgressTopic = "__outboxd_progress"

// DefaultMaxMessageBytes is Config.MaxMessageBytes unless set: 1 MiB, the
// default message.max.bytes of a Kafka broker (which allows 12 bytes more).
const DefaultMaxMessageBytes = 1 << 20

// MaxMessageBytesLimit bounds Config.MaxMessageBytes: a produce request
// holds at least one batch, and sarama sends no request over 100 MiB.
const MaxMessageBytesLimit = 64 << 20

// Config says how the relay publishes. The zero value is not usable: start
// from DefaultConfig.
type Config struct {
	// Brokers are the bootstrap addresses (host:port) of the Kafka cluster.
	Brokers []string
	// Kafka is how every client of the relay connects (TLS, SASL): its
	// producer, its admin client and its progress reader alike. The zero
	// value connects in plaintext. Its fields can be set from outside this
	// module too (Kafka.TLS = a *tls.Config, Kafka.SASL.Mechanism = ...).
	Kafka kafkasec.Settings
	// Mode is ModeExactlyOnce (default) or ModeAtLeastOnce.
	Mode Mode
	// TransactionalID is the Kafka transactional id of the exactly-once
	// producer. It must be stable for a database and unique to it: a second
	// relay on the same id fences the first. Empty means "outboxd-" plus
	// the id the store generates once (Store.MetaID "relay_id").
	TransactionalID string
	// ProgressTopic is the compacted topic holding the relay's progress
	// records (exactly-once mode).
	ProgressTopic string
	// Batch is the most rows published in one transaction (or one
	// at-least-once batch).
	Batch int
	// Wait is how long a batch smaller than Batch waits for more rows
	// before it is published. 0 publishes whatever is there at once.
	Wait time.Duration
	// CreateTopics lets the relay create missing output topics. When
	// false, a missing topic stops publishing (the relay retries, and goes
	// on once the topic exists) with an error naming it. The progress
	// topic is the relay's own and is created compacted, with one
	// partition, either way.
	CreateTopics bool
	// TopicPartitions and TopicReplication are used for output topics the
	// relay creates; TopicReplication also for the progress topic.
	TopicPartitions  int32
	TopicReplication int16
	// Retention is how long published rows stay in the outbox before they
	// are pruned. 0 prunes them as soon as they are published.
	Retention time.Duration
	// PollInterval is the fallback poll for new rows when no commit signal
	// arrives; the relay is normally woken by Store.Committed.
	PollInterval time.Duration
	// MinBackoff and MaxBackoff bound the capped exponential backoff
	// between attempts while Kafka is unreachable or failing.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// UnauthorizedBackoff is the wait after Kafka refused the relay's
	// credentials or an operation its ACLs do not grant (class
	// Unauthorized): only an operator can fix that, so the relay asks
	// seldom, and goes on by itself once it is allowed.
	UnauthorizedBackoff time.Duration
	// TransactionTimeout is the Kafka transaction timeout: the coordinator
	// aborts a transaction left open longer (a crashed relay's, say).
	TransactionTimeout time.Duration
	// RequestTimeout is how long the relay waits for a broker's answer to
	// one request. A produce that gets none is in doubt: the broker may
	// still write it, so the transaction is never ended with the
	// producer's epoch (see txnProducer); the next producer's
	// initialisation ends it. The broker is asked to answer a produce
	// within two thirds of it.
	RequestTimeout time.Duration
	// DeliveryTimeout bounds, as the Java client's delivery.timeout.ms,
	// how long a batch a leader refuses with a retriable code (a leader
	// moving, not enough replicas), whose partition has no leader, or
	// whose produce got no answer, is sent again within its transaction,
	// and how long a busy or moving transaction coordinator is asked
	// again, each with a backoff: a broker's failover takes seconds and
	// does not end the relay's session. Past it the session ends (the next
	// one aborts the transaction and publishes its rows again). At least
	// RequestTimeout, and below TransactionTimeout in exactly-once mode.
	DeliveryTimeout time.Duration
	// ShutdownTimeout bounds how long Run, once its context is done, waits
	// for the transaction in hand to commit or abort.
	ShutdownTimeout time.Duration
	// MaxMessageBytes is the largest record batch the relay sends, counted
	// as a broker counts it against its message.max.bytes: a record alone
	// in its batch has this less outbox.RecordBatchOverhead. A row whose
	// record is larger is not published: it is stored as a dead letter of
	// its feed (outbox.ReasonOutputTooLarge, the row whole) and publishing
	// goes on, as it does past a record a broker refuses as too large (a
	// topic's max.message.bytes below this). Between
	// outbox.MinMessageBytes and MaxMessageBytesLimit; keep it at or below
	// the brokers' message.max.bytes.
	MaxMessageBytes int
	// NewDatabase lets CheckDatabase accept a database that never
	// published where an earlier database at the same path on the same
	// host did: every output is then published again. The choice is
	// recorded in the database (Store.AcceptAsNew), so later starts need
	// not repeat it.
	NewDatabase bool
	// Timestamp is the time each record carries: TimestampPublish
	// (default) or TimestampCreated.
	Timestamp string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnTransaction, if set, is told the duration (from the first record
	// sent to the commit's answer) and the record count of every committed
	// exactly-once transaction, for metrics.
	OnTransaction func(d time.Duration, records int)
}

// DefaultConfig returns the defaults: exactly-once to a broker on
// 127.0.0.1:9092, batches of 4000 rows or 1ms, records of at most 1 MiB,
// topics created with 3 partitions and replication 1, rows kept 24h after
// publishing.
func DefaultConfig() Config {
	return Config{
		Brokers:             []string{"127.0.0.1:9092"},
		Mode:                ModeExactlyOnce,
		ProgressTopic:       DefaultProgressTopic,
		Batch:               4000,
		Wait:                time.Millisecond,
		CreateTopics:        true,
		TopicPartitions:     3,
		TopicReplication:    1,
		Retention:           24 * time.Hour,
		PollInterval:        200 * time.Millisecond,
		MinBackoff:          100 * time.Millisecond,
		MaxBackoff:          5 * time.Second,
		UnauthorizedBackoff: DefaultUnauthorizedBackoff,
		TransactionTimeout:  time.Minute,
		RequestTimeout:      DefaultRequestTimeout,
		DeliveryTimeout:     DefaultDeliveryTimeout,
		ShutdownTimeout:     10 * time.Second,
		MaxMessageBytes:     DefaultMaxMessageBytes,
		Timestamp:           TimestampPublish,
	}
}

// DefaultRequestTimeout is Config.RequestTimeout unless set.
const DefaultRequestTimeout = 15 * time.Second

// DefaultDeliveryTimeout is Config.DeliveryTimeout unless set.
const DefaultDeliveryTimeout = 30 * time.Second

// DefaultUnauthorizedBackoff is Config.UnauthorizedBackoff unless set: an
// ACL granted, or a password put right, is picked up within it.
const DefaultUnauthorizedBackoff = 10 * time.Second

// maxBatch keeps a transaction's records well within sarama's buffers and
// the memory of one batch bounded.
const maxBatch = 100_000

// Validate reports every invalid field, joined; nil when the config is usable.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Brokers) == 0 {
		add("brokers: at least one is required")
	}
	for _, b := range c.Brokers {
		if b == "" {
			add("brokers: empty address")
		}
	}
	switch c.Mode {
	case ModeExactlyOnce:
		if c.ProgressTopic == "" {
			add("progress topic: required in %s mode", ModeExactlyOnce)
		}
	case ModeAtLeastOnce:
	default:
		add("mode: %q is not one of %s, %s", c.Mode, ModeExactlyOnce, ModeAtLeastOnce)
	}
	if c.Batch < 1 || c.Batch > maxBatch {
		add("batch: %d is not within 1..%d", c.Batch, maxBatch)
	}
	if c.TopicPartitions < 1 {
		add("topic partitions: %d is below 1", c.TopicPartitions)
	}
	if c.TopicReplication < 1 {
		add("topic replication: %d is below 1", c.TopicReplication)
	}
	if c.MaxMessageBytes < outbox.MinMessageBytes || c.MaxMessageBytes > MaxMessageBytesLimit {
		add("max message bytes: %d is not within %d..%d", c.MaxMessageBytes, outbox.MinMessageBytes, MaxMessageBytesLimit)
	}
	if c.Timestamp != TimestampPublish && c.Timestamp != TimestampCreated {
		add("timestamp: %q is not one of %s, %s", c.Timestamp, TimestampPublish, TimestampCreated)
	}
	c.validateDurations(add)
	return errors.Join(errs...)
}

func (c Config) validateDurations(add func(string, ...any)) {
	nonNegative := map[string]time.Duration{"wait": c.Wait, "retention": c.Retention}
	positive := map[string]time.Duration{
		"poll interval": c.PollInterval, "min backoff": c.MinBackoff, "max backoff": c.MaxBackoff,
		"transaction timeout": c.TransactionTimeout, "shutdown timeout": c.ShutdownTimeout,
		"unauthorized backoff": c.UnauthorizedBackoff, "request timeout": c.RequestTimeout,
		"delivery timeout": c.DeliveryTimeout,
	}
	for name, d := range nonNegative {
		if d < 0 {
			add("%s: %v is negative", name, d)
		}
	}
	for name, d := range positive {
		if d <= 0 {
			add("%s: %v is not positive", name, d)
		}
	}
	if c.MaxBackoff < c.MinBackoff {
		add("max backoff: %v is below min backoff %v", c.MaxBackoff, c.MinBackoff)
	}
	if c.Mode == ModeExactlyOnce && c.TransactionTimeout < time.Second {
		add("transaction timeout: %v is below 1s", c.TransactionTimeout)
	}
	if c.DeliveryTimeout < c.RequestTimeout {
		add("delivery timeout: %v is below the request timeout %v", c.DeliveryTimeout, c.RequestTimeout)
	}
	if c.Mode == ModeExactlyOnce && c.DeliveryTimeout >= c.TransactionTimeout {
		add("delivery timeout: %v is not below the transaction timeout %v", c.DeliveryTimeout, c.TransactionTimeout)
	}
}
