// Package kafkafeed is the Kafka feed: an ingest.Feed over the partitions of
// a topic (and extra topics, such as a retry topic), read with sarama from
// the positions the store holds. Its epochs are topic IDs with the partition,
// and offsets deleted by retention before they were read are losses.
// GroupFeed shares a topic's partitions among servers on one database
// through a Kafka consumer group, each partition fenced by its owner epoch
// in the store (group.go).
package kafkafeed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox"
)

// kafkaFetchBytes is what one fetch asks of each partition (sarama's
// Consumer.Fetch.Default; a bigger record is fetched whole, the size
// doubled until it fits). A fetch's records are parsed all at once into
// messages that hold their decompressed batches, so it sets the memory a
// partition in flight costs: smaller than sarama's 1 MiB for the server's
// peak memory at no cost in rate (the figures are in docs/performance.md,
// "The Kafka feed fetches 64 KiB").
const kafkaFetchBytes = 64 << 10

// Defaults of Config.
const (
	DefaultMetadataRefresh = 2 * time.Second
	DefaultCommitInterval  = time.Second
)

// Reasons a Kafka feed gives for a RecordLoss.
const (
	// LossRetention: offsets deleted (by retention or DeleteRecords) before
	// the feed read them: From is the position the feed stood at, To the
	// partition's log start offset.
	LossRetention = "deleted by retention before read"
	// LossTopicReplaced: the topic was deleted and created again (another
	// topic ID) with records of the old one not applied: From is the
	// position the feed stood at, To the old incarnation's end as last
	// confirmed, or the position after its last record read and dropped
	// (see Feed), whichever is further.
	LossTopicReplaced = "topic deleted and re-created before read"
)

// Log keys of the Kafka feed.
const (
	logSource    = "source"    // the topics read
	logTopic     = "topic"     // the topic of one partition
	logPartition = "partition" // a feed partition
	logEpoch     = "epoch"
	logFrom      = "from"
	logTo        = "to"
	logErr       = "err"
)

// PartitionStride separates the partition spaces of a Kafka feed's
// topics: partition p of Topic is feed partition p, and partition p of the
// k-th extra topic (Topics[k-1]) is feed partition k*PartitionStride+p.
// So a retry topic's positions never mix with the main topic's.
const PartitionStride = 1 << 16

// maxExtraTopics keeps every feed partition within int32.
const maxExtraTopics = 1<<15 - 2

// FeedPartition returns the feed partition of partition p of the topic
// at index topic (0: Config.Topic, k: Topics[k-1]).
func FeedPartition(topic int, p int32) int32 {
	return int32(topic)*PartitionStride + p
}

// TopicPartition reverses FeedPartition.
func TopicPartition(feedPartition int32) (topic int, p int32) {
	return int(feedPartition / PartitionStride), feedPartition % PartitionStride
}

// Epoch is the epoch of a partition of the topic with the given ID:
// "ID:PARTITION", the ID in Kafka's own text form (base64url, no padding).
// A topic deleted and created again gets a new ID, hence new epochs.
func Epoch(topicID string, partition int32) string {
	return topicID + ":" + strconv.FormatInt(int64(partition), 10)
}

// Config configures a Feed.
type Config struct {
	// Brokers are the bootstrap addresses (host:port). Required.
	Brokers []string
	// Topic is the feed's main topic. Required.
	Topic string
	// Topics are extra topics read by the same feed (a retry topic), each
	// in its own partition space (see PartitionStride). Their records
	// that carry HeaderRetryDue are held until that time.
	Topics []string
	// Group is the consumer group under which offsets are committed after
	// each store commit, so lag shows in Kafka's tools. It is never read
	// from: the store's positions are the authority. Empty: no commits.
	Group string
	// MetadataRefresh is how often the topics' metadata is read to find new
	// partitions and re-created topics (default DefaultMetadataRefresh).
	MetadataRefresh time.Duration
	// CommitInterval is the most often offsets are committed to the group
	// (default DefaultCommitInterval).
	CommitInterval time.Duration
	// ClientID names the feed's connections to the brokers (default
	// "outboxd-feed").
	ClientID string
	// Kafka is how the feed's clients connect (TLS, SASL), its group
	// committer's included; the zero value is plaintext.
	Kafka kafkasec.Settings
	// RefusedRetry is how long the feed waits before it asks again after
	// Kafka refused its credentials or an operation (default
	// DefaultRefusedRetry): only an operator can fix that.
	RefusedRetry time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.MetadataRefresh <= 0 {
		c.MetadataRefresh = DefaultMetadataRefresh
	}
	if c.CommitInterval <= 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.ClientID == "" {
		c.ClientID = "outboxd-feed"
	}
	if c.RefusedRetry <= 0 {
		c.RefusedRetry = DefaultRefusedRetry
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka feed: no brokers")
	}
	if c.Topic == "" {
		return errors.New("kafka feed: no topic")
	}
	if len(c.Topics) > maxExtraTopics {
		return fmt.Errorf("kafka feed: %d extra topics, at most %d", len(c.Topics), maxExtraTopics)
	}
	seen := map[string]bool{c.Topic: true}
	for _, t := range c.Topics {
		if t == "" || seen[t] {
			return fmt.Errorf("kafka feed: extra topic %q is empty or read twice", t)
		}
		seen[t] = true
	}
	return nil
}

// topics returns every topic read, the main one first.
func (c Config) topics() []string {
	return append([]string{c.Topic}, c.Topics...)
}

// Feed reads every partition of a topic (and of its extra Topics),
// picking up partitions added later, with one direct sarama partition
// consumer per partition and read_committed isolation.
//
// Each record is an item: Key, Value and Headers as in Kafka, Position the
// record's offset + 1, Partition as PartitionStride says, Epoch
// Epoch(topic ID, partition). Records are never skipped: the fetch size
// has no upper bound, and a record too big for one fetch is fetched again
// with a bigger one.
//
// The store's checkpoints are the authority: Open reads each partition right
// after its checkpoint, never from the group's offset. A partition without
// one starts at its log start offset with a RecordEpoch there. A checkpoint
// below the log start offset is reported as a RecordLoss (LossRetention,
// From the checkpoint, To the log start) before reading on from the log
// start; so is a gap met while running. A topic whose ID is not the
// checkpoint's (deleted and created again) yields a RecordLoss
// (LossTopicReplaced) for the old epoch when it is known to have held
// records past the checkpoint, then a RecordEpoch for the new one, and is
// read from its start.
//
// Since a fetch cannot say which incarnation of a topic it read, no record
// is yielded, and no high watermark taken as a partition's end (Ends, and
// the extent of a loss), before a metadata request sent after it arrived
// shows its topic still has the epoch's ID (or no longer exists). The end of
// an idle partition is read again every MetadataRefresh, so the end of an
// old incarnation is known even where its last records were never fetched.
// When a topic is found re-created, the records read and not yet confirmed
// are compared with the new incarnation: one it holds at the same offset
// (same key, value, headers and timestamp) was its own, read at the old
// offsets, and is read again in the new epoch; the others were the old
// incarnation's and count in its loss. Records of the old incarnation that
// were confirmed are yielded and applied: they are not lost. This holds as
// far as the brokers' metadata is current.
//
// A record of an extra topic carrying HeaderRetryDue is not yielded before
// that time; the records behind it in its partition wait with it, and no
// other partition does. Commit records each partition's position as the
// group's offset, sent at most every CommitInterval and on Close.
//
// Open, Poll, Commit and Close are called from one goroutine, except that
// Close may be called while Poll waits, to end it. Ends may be called from
// any goroutine.
type Feed struct {
	cfg    Config
	topics []string
	log    *slog.Logger

	// client asks for metadata and offsets and commits the group's;
	// fetches go through fetcher's connections, so a fetch waiting for
	// records never delays those requests.
	client   sarama.Client
	fetcher  sarama.Client
	consumer sarama.Consumer

	mu       sync.Mutex
	opened   bool
	closed   bool
	slots    map[int32]*kafkaSlot
	order    []*kafkaSlot         // slots by feed partition
	ids      map[string]string    // topic -> ID of the runs started
	verified map[string]time.Time // topic -> start of the last metadata request that confirmed it
	rr       int                  // the slot Poll starts at, for fairness

	ready    chan struct{} // a record may be ready
	checkReq chan struct{} // a metadata check is wanted
	ctx      context.Context
	stop     context.CancelFunc // called by Close
	done     <-chan struct{}    // ctx.Done()
	wg       sync.WaitGroup

	commits  *kafkaCommitter
	troubles troubles
}

var _ ingest.Feed = (*Feed)(nil)

// New returns a feed on cfg's topics. Nothing is connected before
// Open; a config that Validate refuses makes Open fail.
func New(cfg Config) *Feed {
	cfg = cfg.withDefaults()
	ctx, stop := context.WithCancel(context.Background())
	return &Feed{
		ctx:      ctx,
		stop:     stop,
		done:     ctx.Done(),
		cfg:      cfg,
		topics:   cfg.topics(),
		log:      cfg.Logger.With("component", "kafka-feed", logSource, strings.Join(cfg.topics(), ",")),
		slots:    map[int32]*kafkaSlot{},
		ids:      map[string]string{},
		verified: map[string]time.Time{},
		ready:    make(chan struct{}, 1),
		checkReq: make(chan struct{}, 1),
	}
}

// Kind returns KindKafka.
func (f *Feed) Kind() string { return ingest.KindKafka }

// Source returns the topics read, comma-separated, the main one first.
func (f *Feed) Source() string { return strings.Join(f.topics, ",") }

// Open connects to the brokers and positions each partition after its
// checkpoint in from (keyed by feed partition); partitions without one start
// at their log start offset. It waits for the brokers while ctx allows, so a
// Kafka outage at start delays the feed rather than failing it. Topics that
// do not exist yet are read once they do. It returns an error for an
// unusable config, when ctx ends first, or when the feed was opened before.
func (f *Feed) Open(ctx context.Context, from map[int32]outbox.Checkpoint) error {
	if err := f.cfg.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	if f.opened || f.closed {
		f.mu.Unlock()
		return fmt.Errorf("open kafka feed %s: already opened", f.cfg.Topic)
	}
	f.opened = true
	f.resumeFrom(from)
	f.mu.Unlock()
	if err := f.connect(ctx); err != nil {
		return fmt.Errorf("open kafka feed %s: %w", f.cfg.Topic, err)
	}
	f.commits = newKafkaCommitter(f)
	f.checked(f.check(), false)
	f.wg.Add(2)
	go f.manage()
	go f.commits.run()
	return nil
}

// resumeFrom makes a slot for each stored checkpoint of a topic read.
func (f *Feed) resumeFrom(from map[int32]outbox.Checkpoint) {
	for p, cp := range from {
		ti, kp := TopicPartition(p)
		if p < 0 || ti >= len(f.topics) || cp.Epoch == "" {
			f.log.Warn("ignoring a checkpoint of no topic read", logPartition, p, logEpoch, cp.Epoch)
			continue
		}
		s := f.slot(ti, kp)
		s.epoch, s.next, s.yielded, s.end, s.seen = cp.Epoch, cp.Position, cp.Position, cp.End, cp.End
	}
}

// connect creates the sarama clients and consumer, retrying while ctx
// allows.
func (f *Feed) connect(ctx context.Context) error {
	for {
		err := f.dial(ctx)
		if err == nil {
			if f.troubles.clear(troubleConnect) {
				f.log.Info("Kafka accepts the feed again")
			}
			return nil
		}
		var cerr sarama.ConfigurationError
		if errors.As(err, &cerr) {
			return err
		}
		wait := time.Second
		switch changed, refused := f.troubles.set(troubleConnect, err); {
		case changed:
			f.log.Error("Kafka refused the feed: nothing is read until an operator fixes it; asking again every "+
				f.cfg.RefusedRetry.String(), "brokers", f.cfg.Brokers, logErr, err)
			wait = f.cfg.RefusedRetry
		case refused:
			wait = f.cfg.RefusedRetry
		default:
			f.log.Warn("connecting to the brokers (will retry)", "brokers", f.cfg.Brokers, logErr, err)
		}
		if clock.Sleep(ctx, wait) != nil {
			return ctx.Err()
		}
	}
}

// checkAccess checks the feed's credentials with one connection before
// its clients dial (kafkasec.Settings.Check), when it has any: sarama's
// clients would try each broker, each retry, with a refused password.
func (f *Feed) checkAccess(ctx context.Context) error {
	if f.cfg.Kafka.TLS == nil && f.cfg.Kafka.SASL.Mechanism == "" {
		return nil
	}
	return f.cfg.Kafka.Check(ctx, f.cfg.Brokers)
}

func (f *Feed) dial(ctx context.Context) error {
	if err := f.checkAccess(ctx); err != nil {
		return err
	}
	client, fetcher, consumer, err := f.newClients()
	if err != nil {
		return err
	}
	f.client, f.fetcher, f.consumer = client, fetcher, consumer
	return nil
}

// newClients makes the feed's two clients (metadata and offsets; fetches) and
// the partition consumer on the second, closing what it made on an error.
func (f *Feed) newClients() (client, fetcher sarama.Client, consumer sarama.Consumer, err error) {
	client, err = sarama.NewClient(f.cfg.Brokers, f.saramaConfig())
	if err != nil {
		return nil, nil, nil, err
	}
	fetcher, err = sarama.NewClient(f.cfg.Brokers, f.saramaConfig())
	if err != nil {
		client.Close()
		return nil, nil, nil, err
	}
	consumer, err = sarama.NewConsumerFromClient(fetcher)
	if err != nil {
		fetcher.Close()
		client.Close()
		return nil, nil, nil, fmt.Errorf("consumer: %w", err)
	}
	return client, fetcher, consumer, nil
}

func (f *Feed) saramaConfig() *sarama.Config {
	// The product's sarama settings: version, TLS and SASL, no topic
	// created by a metadata request.
	c := kafka.Config(f.cfg.ClientID, f.cfg.Kafka)
	c.Net.ReadTimeout = 10 * time.Second
	c.Net.WriteTimeout = 10 * time.Second
	c.Metadata.AllowAutoTopicCreation = false // reading a topic never creates it
	c.Metadata.Full = false
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Consumer.Return.Errors = true
	c.Consumer.Retry.Backoff = 500 * time.Millisecond
	c.Consumer.MaxWaitTime = 250 * time.Millisecond // also how long closing waits for a fetch
	c.Consumer.Fetch.Max = 0                        // no limit: a big record is fetched whole, never skipped
	c.Consumer.Fetch.Default = kafkaFetchBytes
	c.Consumer.Offsets.AutoCommit.Enable = false
	return c
}

// Ends returns each partition's end as last confirmed, by feed partition:
// its high watermark, or its position when the offsets between them hold
// no record a read_committed reader gets (commit markers, aborted records;
// the feed looks every MetadataRefresh at an idle partition whose high
// watermark is ahead). Safe for concurrent use.
func (f *Feed) Ends() map[int32]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[int32]int64, len(f.slots))
	for p, s := range f.slots {
		if s.epoch != "" {
			m[p] = s.end
		}
	}
	return m
}

// Close stops the partition consumers, commits the group's offsets for the
// last checkpoints given to Commit (bounded by a few seconds), disconnects,
// and wakes a waiting Poll, which then returns an error wrapping
// fs.ErrClosed. Closing twice returns nil.
func (f *Feed) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.stop()
	runs := make([]*kafkaRun, 0, len(f.slots))
	for _, s := range f.slots {
		if s.run != nil {
			runs = append(runs, s.run)
			s.run = nil
		}
	}
	f.mu.Unlock()
	for _, r := range runs {
		r.stop()
	}
	var errs []error
	if f.consumer != nil {
		errs = append(errs, f.consumer.Close())
	}
	if f.commits != nil {
		f.commits.flush()
	}
	if f.client != nil {
		errs = append(errs, f.fetcher.Close(), f.client.Close())
	}
	f.wg.Wait()
	return errors.Join(errs...)
}

// usable returns why the feed cannot be polled, if it cannot. f.mu is held.
func (f *Feed) usable() error {
	switch {
	case f.closed:
		return fmt.Errorf("poll kafka feed %s: %w", f.cfg.Topic, fs.ErrClosed)
	case !f.opened:
		return fmt.Errorf("poll kafka feed %s: not opened", f.cfg.Topic)
	}
	return nil
}

// slot returns the slot of partition kp of topic ti, creating it. f.mu is
// held.
func (f *Feed) slot(ti int, kp int32) *kafkaSlot {
	p := FeedPartition(ti, kp)
	if s, ok := f.slots[p]; ok {
		return s
	}
	s := &kafkaSlot{feedPart: p, topic: f.topics[ti], ti: ti, part: kp, space: make(chan struct{}, 1)}
	f.slots[p] = s
	f.order = append(f.order, s)
	sort.Slice(f.order, func(i, j int) bool { return f.order[i].feedPart < f.order[j].feedPart })
	return s
}

// slotLog is the feed's logger for one partition.
func (f *Feed) slotLog(s *kafkaSlot) *slog.Logger {
	return f.log.With(logTopic, s.topic, logPartition, s.feedPart)
}

// signal makes a non-blocking send on a wake-up channel.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
