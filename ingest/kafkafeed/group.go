package kafkafeed

// The group feed: many servers, one feed.
//
// A GroupFeed is a Kafka feed shared by the servers of a consumer group:
// the group only assigns the topic's partitions (sarama's ConsumerGroup,
// the cooperative-sticky strategy, which sarama supports since v1.61: a
// rebalance moves only the partitions that change hands, the others keep
// being read); the positions stay in the store, as for a Feed. So the
// group's committed offsets are never read from: they are written after
// each store commit for Kafka's tools, as Feed does.
//
// On assignment (ConsumeClaim) the feed takes the partition in the store
// (outbox.Store.ClaimPartition bumps its owner epoch), then reads its
// position, then reads the partition from there with a partition consumer
// of its own (read_committed); the group's own claim consumer is paused,
// its records unused. From the claim on, every batch transaction that
// touches the partition checks the epoch inside itself (see
// outbox/partowner.go), so a server paused or cut off past its session
// commits nothing of the partition once another owns it: its commit fails
// with outbox.ErrPartitionFenced: the loop drops that batch and goes on
// (Dropped: the partitions of it still held are read again from the
// store's positions), and the server keeps its other partitions.
//
// On revocation (the claim's Messages channel closes, or the session
// ends) the feed yields no more of the partition and drops what it had
// read but not yielded; the batch in hand, yielded to the loop, is
// committed (Commit reports the partition's position reached what was
// yielded) before the revoke completes and the partition is released in
// the store. A batch that does not commit within the rebalance timeout is
// dropped: the partition is released anyway, and the batch's commit fails
// with outbox.ErrPartitionFenced.
//
// Such a partition is pending until the loop reports that batch committed
// (Commit) or dropped (Dropped): a new claim of it by this server waits
// for that (at most until its session ends). Without the wait the group
// could give the partition back to this server, which would claim it at a
// new epoch, and the old batch, read before another server applied the
// partition further, would then pass the owner check at that new epoch and
// apply again what the other applied. With it the old batch meets a
// partition this store does not hold, is fenced and dropped, and the new
// claim reads the position the other server left.
//
// A group feed reads one topic (no extra topics). Its epochs, losses and
// positions are those of Feed: Epoch(topic ID, partition), offset + 1; a
// position below the log start is a LossRetention, a topic whose ID is not
// the checkpoint's a LossTopicReplaced.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox"
)

// Defaults of GroupConfig.
const (
	DefaultSessionTimeout   = 6 * time.Second
	DefaultHeartbeat        = 1 * time.Second
	DefaultRebalanceTimeout = 10 * time.Second
)

// groupBuffer is the most records of one partition read and not yet
// yielded.
const groupBuffer = 4096

// GroupConfig configures a GroupFeed.
type GroupConfig struct {
	// Config is the Kafka feed's: Brokers, Topic, Kafka, ClientID and
	// Logger are used; Group names the consumer group (required); Topics
	// must be empty.
	Config
	// Feed is the feed's name in the store. Required.
	Feed string
	// Store is the store the feed's batches commit to: the partitions are
	// claimed there. Required.
	Store *outbox.Store
	// Owner names this server in the store's partition owners. Required.
	Owner string
	// SessionTimeout is the group's session timeout: a server silent that
	// long loses its partitions (default DefaultSessionTimeout).
	SessionTimeout time.Duration
	// Heartbeat is the group's heartbeat interval (default
	// DefaultHeartbeat).
	Heartbeat time.Duration
	// RebalanceTimeout bounds how long a revoked partition waits for its
	// batch in hand to commit (default DefaultRebalanceTimeout).
	RebalanceTimeout time.Duration
}

func (c GroupConfig) withDefaults() GroupConfig {
	c.Config = c.Config.withDefaults()
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.RebalanceTimeout <= 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	return c
}

// Validate reports the first unusable field.
func (c GroupConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	switch {
	case c.Group == "":
		return errors.New("kafka group feed: no group")
	case len(c.Topics) > 0:
		return errors.New("kafka group feed: reads one topic, no extra topics (a retry topic)")
	case c.Feed == "" || c.Store == nil || c.Owner == "":
		return errors.New("kafka group feed: feed name, store and owner are required")
	}
	return nil
}

// GroupFeed is a Kafka feed whose partitions a consumer group spreads over
// the servers sharing one store (see the top of this file). Its methods
// are called as Feed's are.
type GroupFeed struct {
	cfg GroupConfig
	log *slog.Logger

	client   sarama.Client // metadata, offsets
	fetcher  sarama.Client
	consumer sarama.Consumer
	group    sarama.ConsumerGroup

	mu    sync.Mutex
	cond  *sync.Cond // signalled when a partition's committed position moves or the feed closes
	parts map[int32]*groupPart
	// pending holds each partition released with a batch of it still in
	// hand, until Commit or Dropped reports that batch: a new claim of it
	// waits (settle).
	pending map[int32]*groupPart
	waiters int // claims waiting in settle
	opened  bool
	closed  bool
	rr      int

	ready chan struct{}
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

// groupPart is a partition this server holds.
type groupPart struct {
	p         int32
	epoch     string
	recs      []ingest.Record // read, not yet yielded
	yielded   int64           // the position after the last record yielded
	committed int64           // the position the store has, as Commit said
	waiting   bool            // records were yielded that no Commit has covered yet
	end       int64           // the high watermark last seen
	active    bool            // false once revoked: nothing more is yielded
	rewinding bool            // the loop dropped records of it: it is read again from the store's position
	rewind    chan struct{}   // signalled when rewinding is set
	space     chan struct{}   // signalled when recs shrinks
	sess      sarama.ConsumerGroupSession
}

var _ ingest.Feed = (*GroupFeed)(nil)

// NewGroup returns a group feed on cfg. Nothing is connected before Open.
func NewGroup(cfg GroupConfig) *GroupFeed {
	cfg = cfg.withDefaults()
	ctx, stop := context.WithCancel(context.Background())
	g := &GroupFeed{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "kafka-group-feed", logSource, cfg.Topic, "group", cfg.Group),
		parts:   map[int32]*groupPart{},
		pending: map[int32]*groupPart{},
		ready:   make(chan struct{}, 1),
		ctx:     ctx,
		stop:    stop,
	}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// Kind returns KindKafka.
func (g *GroupFeed) Kind() string { return ingest.KindKafka }

// Source returns the topic read.
func (g *GroupFeed) Source() string { return g.cfg.Topic }

// Open connects and joins the group. from is not used: each partition's
// position is read from the store when the group assigns it. It waits for
// the brokers while ctx allows.
func (g *GroupFeed) Open(ctx context.Context, _ map[int32]outbox.Checkpoint) error {
	if err := g.cfg.Validate(); err != nil {
		return err
	}
	g.mu.Lock()
	if g.opened || g.closed {
		g.mu.Unlock()
		return fmt.Errorf("open kafka group feed %s: already opened", g.cfg.Topic)
	}
	g.opened = true
	g.mu.Unlock()
	g.cfg.Store.SetGroupFeed(g.cfg.Feed)
	for {
		err := g.dial()
		if err == nil {
			break
		}
		var cerr sarama.ConfigurationError
		if errors.As(err, &cerr) {
			return fmt.Errorf("open kafka group feed %s: %w", g.cfg.Topic, err)
		}
		g.log.Warn("connecting to the brokers (will retry)", "brokers", g.cfg.Brokers, logErr, err)
		if clock.Sleep(ctx, time.Second) != nil {
			return fmt.Errorf("open kafka group feed %s: %w", g.cfg.Topic, ctx.Err())
		}
	}
	g.wg.Add(2)
	go g.consume()
	go g.errors()
	return nil
}

func (g *GroupFeed) dial() error {
	f := &Feed{cfg: g.cfg.Config}
	client, fetcher, consumer, err := f.newClients()
	if err != nil {
		return err
	}
	gc := f.saramaConfig()
	gc.ClientID = g.cfg.ClientID + "-group"
	gc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	gc.Consumer.Group.Session.Timeout = g.cfg.SessionTimeout
	gc.Consumer.Group.Heartbeat.Interval = g.cfg.Heartbeat
	gc.Consumer.Group.Rebalance.Timeout = g.cfg.RebalanceTimeout
	gc.Consumer.Offsets.AutoCommit.Enable = true
	gc.Consumer.Offsets.AutoCommit.Interval = g.cfg.CommitInterval
	gc.Consumer.Offsets.Initial = sarama.OffsetOldest
	gc.ChannelBufferSize = 1 // its claims' records are not used
	group, err := sarama.NewConsumerGroup(g.cfg.Brokers, g.cfg.Group, gc)
	if err != nil {
		consumer.Close()
		fetcher.Close()
		client.Close()
		return fmt.Errorf("consumer group %s: %w", g.cfg.Group, err)
	}
	g.client, g.fetcher, g.consumer, g.group = client, fetcher, consumer, group
	return nil
}

// consume keeps the feed in the group until it closes.
func (g *GroupFeed) consume() {
	defer g.wg.Done()
	for g.ctx.Err() == nil {
		err := g.group.Consume(g.ctx, []string{g.cfg.Topic}, groupHandler{g})
		if errors.Is(err, sarama.ErrClosedConsumerGroup) || g.ctx.Err() != nil {
			return
		}
		if err != nil {
			g.log.Warn("consumer group session ended (rejoining)", logErr, err)
			if clock.Sleep(g.ctx, time.Second) != nil {
				return
			}
		}
	}
}

// errors logs the group's errors.
func (g *GroupFeed) errors() {
	defer g.wg.Done()
	for err := range g.group.Errors() {
		g.log.Warn("consumer group", logErr, err)
	}
}

// groupHandler is the feed as sarama's handler.
type groupHandler struct{ g *GroupFeed }

// Setup does nothing: partitions are taken in ConsumeClaim.
func (groupHandler) Setup(sarama.ConsumerGroupSession) error { return nil }

// Cleanup does nothing: partitions are released in ConsumeClaim.
func (groupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim holds one partition for as long as the group assigns it.
func (h groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	return h.g.hold(sess, claim)
}

// hold takes a partition, reads it while it is assigned, then waits for
// the batch in hand and releases it.
func (g *GroupFeed) hold(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	topic, p := claim.Topic(), claim.Partition()
	g.group.Pause(map[string][]int32{topic: {p}})
	log := g.log.With(logPartition, p)
	ctx := sess.Context()
	gp, start, err := g.take(ctx, p, sess)
	if err != nil {
		log.Error("taking the partition", logErr, err)
		return err
	}
	taken := time.Now()
	log.Info("partition taken", logEpoch, gp.epoch, "position", start)
	defer g.release(gp, log)
	next := start
	for {
		pc, err := g.consumer.ConsumePartition(topic, p, next)
		if errors.Is(err, sarama.ErrOffsetOutOfRange) {
			if next, err = g.lost(gp, next); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s[%d] from %d: %w", topic, p, next, err)
		}
		var revoked bool
		next, revoked = g.read(ctx, gp, pc, claim, next, log)
		pc.AsyncClose()
		for range pc.Messages() {
		}
		if revoked {
			log.Info("partition revoked", "held", time.Since(taken).Round(time.Millisecond))
			return nil
		}
		if from, ok, err := g.rewound(gp); err != nil {
			return err
		} else if ok {
			log.Info("the loop dropped a fenced batch: reading the partition again from the store's position",
				"position", from)
			next = from
		}
	}
}

// read forwards a partition consumer's records until the partition is
// revoked (true) or the consumer ends (false: read again from next).
func (g *GroupFeed) read(ctx context.Context, gp *groupPart, pc sarama.PartitionConsumer,
	claim sarama.ConsumerGroupClaim, next int64, log *slog.Logger) (int64, bool) {
	for {
		select {
		case <-ctx.Done():
			return next, true
		case _, ok := <-claim.Messages():
			if !ok {
				return next, true
			}
		case <-gp.rewind:
			return next, false // read again from the store's position
		case err, ok := <-pc.Errors():
			if ok {
				log.Warn("reading the partition", logErr, err)
			}
		case m, ok := <-pc.Messages():
			if !ok {
				return next, false
			}
			rec := ingest.Record{Kind: ingest.RecordItem, Partition: gp.p, Topic: m.Topic, Epoch: gp.epoch,
				Position: m.Offset + 1, Item: ingest.Item{Key: m.Key, Value: m.Value, Headers: headers(m.Headers)}}
			if !g.enqueue(ctx, gp, rec, pc.HighWaterMarkOffset()) {
				return next, true
			}
			next = m.Offset + 1
		}
	}
}

// headers converts sarama's record headers.
func headers(hs []*sarama.RecordHeader) []outbox.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]outbox.Header, len(hs))
	for i, h := range hs {
		out[i] = outbox.Header{Key: string(h.Key), Value: h.Value}
	}
	return out
}

// enqueue adds a record of gp, waiting for room; false once gp is revoked
// or ctx done.
func (g *GroupFeed) enqueue(ctx context.Context, gp *groupPart, rec ingest.Record, hwm int64) bool {
	for {
		g.mu.Lock()
		if !gp.active || g.closed {
			g.mu.Unlock()
			return false
		}
		if gp.rewinding { // read again from the store's position: this one is dropped
			g.mu.Unlock()
			return true
		}
		gp.end = max(gp.end, hwm)
		if len(gp.recs) < groupBuffer {
			gp.recs = append(gp.recs, rec)
			g.mu.Unlock()
			signal(g.ready)
			return true
		}
		g.mu.Unlock()
		select {
		case <-gp.space:
		case <-ctx.Done():
			return false
		case <-g.ctx.Done():
			return false
		}
	}
}

// take claims partition p in the store, reads its position there and
// makes its slot: the records it yields first (an epoch, a loss) are
// queued. It returns the offset to read from.
func (g *GroupFeed) take(ctx context.Context, p int32, sess sarama.ConsumerGroupSession) (*groupPart, int64, error) {
	if err := g.settle(ctx, p); err != nil {
		return nil, 0, err
	}
	if _, err := g.cfg.Store.ClaimPartition(ctx, g.cfg.Feed, p, g.cfg.Owner); err != nil {
		return nil, 0, err
	}
	cps, err := g.cfg.Store.Positions(ctx, g.cfg.Feed)
	if err != nil {
		return nil, 0, err
	}
	cp := cps[p]
	id, err := g.topicID()
	if err != nil {
		return nil, 0, err
	}
	oldest, err := g.client.GetOffset(g.cfg.Topic, p, sarama.OffsetOldest)
	if err != nil {
		return nil, 0, fmt.Errorf("log start of %s[%d]: %w", g.cfg.Topic, p, err)
	}
	epoch := Epoch(id, p)
	gp := &groupPart{p: p, epoch: epoch, active: true, space: make(chan struct{}, 1), rewind: make(chan struct{}, 1),
		sess: sess, end: cp.End}
	start := gp.prime(cp, epoch, oldest)
	gp.yielded, gp.committed = cp.Position, cp.Position
	g.mu.Lock()
	g.parts[p] = gp
	g.mu.Unlock()
	signal(g.ready)
	return gp, start, nil
}

// settle waits until no batch of partition p released in hand is pending
// (see release), ctx is done or the feed closes.
func (g *GroupFeed) settle(ctx context.Context, p int32) error {
	stop := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiters++
	defer func() { g.waiters-- }()
	for g.pending[p] != nil && !g.closed && ctx.Err() == nil {
		g.cond.Wait()
	}
	switch {
	case g.closed:
		return fmt.Errorf("claim %s[%d]: %w", g.cfg.Topic, p, fs.ErrClosed)
	case g.pending[p] != nil:
		return fmt.Errorf("claim %s[%d]: the batch in hand when it was released is not settled: %w", g.cfg.Topic, p,
			context.Cause(ctx))
	}
	return nil
}

// prime queues the records gp yields first from the store's checkpoint cp
// (an epoch, a loss) and returns the offset to read from.
func (gp *groupPart) prime(cp outbox.Checkpoint, epoch string, oldest int64) int64 {
	p, start := gp.p, cp.Position
	switch {
	case cp.Epoch == "":
		start = oldest
		gp.recs = append(gp.recs, ingest.Record{Kind: ingest.RecordEpoch, Partition: p, Epoch: epoch, Position: oldest})
	case cp.Epoch != epoch:
		start = oldest
		gp.recs = append(gp.recs,
			ingest.Record{Kind: ingest.RecordLoss, Partition: p, Epoch: cp.Epoch, From: cp.Position,
				To: max(cp.End, cp.Position), Reason: LossTopicReplaced},
			ingest.Record{Kind: ingest.RecordEpoch, Partition: p, Epoch: epoch, Position: oldest})
	case cp.Position < oldest:
		start = oldest
		gp.recs = append(gp.recs, ingest.Record{Kind: ingest.RecordLoss, Partition: p, Epoch: epoch,
			From: cp.Position, To: oldest, Reason: LossRetention})
	}
	return start
}

// Dropped notes that the loop dropped recs without committing them (a
// commit fenced: one of their partitions moved to another server). A
// revoked partition among them no longer waits for them; a partition
// still held is read again from the position the store has (see rewound).
func (g *GroupFeed) Dropped(_ context.Context, recs []ingest.Record) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range recs {
		delete(g.pending, r.Partition) // the batch in hand at its release is settled
		gp, ok := g.parts[r.Partition]
		if !ok || gp.rewinding {
			continue
		}
		gp.waiting = false // nothing of it is in hand any more
		if gp.active {
			gp.rewinding = true
			clear(gp.recs)
			gp.recs = nil
			gp.yielded = gp.committed
			signal(gp.rewind)
			signal(gp.space)
		}
	}
	g.cond.Broadcast()
}

// rewound reads gp's position from the store again after the loop dropped
// records of it (Dropped), queues what it yields first, and returns the
// offset to read from; ok is false when gp was not dropped.
func (g *GroupFeed) rewound(gp *groupPart) (start int64, ok bool, err error) {
	g.mu.Lock()
	rewinding := gp.rewinding
	g.mu.Unlock()
	if !rewinding {
		return 0, false, nil
	}
	cps, err := g.cfg.Store.Positions(g.ctx, g.cfg.Feed)
	if err != nil {
		return 0, false, err
	}
	cp := cps[gp.p]
	oldest, err := g.client.GetOffset(g.cfg.Topic, gp.p, sarama.OffsetOldest)
	if err != nil {
		return 0, false, fmt.Errorf("log start of %s[%d]: %w", g.cfg.Topic, gp.p, err)
	}
	g.mu.Lock()
	clear(gp.recs)
	gp.recs = nil
	start = gp.prime(cp, gp.epoch, oldest)
	gp.yielded, gp.committed, gp.waiting, gp.rewinding = cp.Position, cp.Position, false, false
	g.mu.Unlock()
	signal(g.ready)
	return start, true, nil
}

// lost queues the loss of the offsets from next to the log start, deleted
// before they were read, and returns the log start.
func (g *GroupFeed) lost(gp *groupPart, next int64) (int64, error) {
	oldest, err := g.client.GetOffset(g.cfg.Topic, gp.p, sarama.OffsetOldest)
	if err != nil {
		return 0, fmt.Errorf("log start of %s[%d]: %w", g.cfg.Topic, gp.p, err)
	}
	if oldest <= next {
		return next, nil
	}
	g.mu.Lock()
	gp.recs = append(gp.recs, ingest.Record{Kind: ingest.RecordLoss, Partition: gp.p, Epoch: gp.epoch,
		From: next, To: oldest, Reason: LossRetention})
	g.mu.Unlock()
	signal(g.ready)
	return oldest, nil
}

// topicID reads the topic's ID.
func (g *GroupFeed) topicID() (string, error) {
	b := g.client.LeastLoadedBroker()
	if b == nil {
		return "", errors.New("metadata: no broker")
	}
	req := sarama.NewMetadataRequest(sarama.V3_6_0_0, []string{g.cfg.Topic})
	req.AllowAutoTopicCreation = false
	resp, err := b.GetMetadata(req)
	if err != nil {
		_ = b.Close()
		return "", fmt.Errorf("metadata of %s: %w", g.cfg.Topic, err)
	}
	for _, t := range resp.Topics {
		if t.Name == g.cfg.Topic && errors.Is(t.Err, sarama.ErrNoError) {
			return t.Uuid.String(), nil
		}
	}
	return "", fmt.Errorf("metadata of %s: no such topic", g.cfg.Topic)
}

// release ends gp: nothing more is yielded, what was read and not yielded
// is dropped, the batch in hand is waited for (at most the rebalance
// timeout), and the partition is released in the store.
func (g *GroupFeed) release(gp *groupPart, log *slog.Logger) {
	deadline := time.Now().Add(g.cfg.RebalanceTimeout)
	timer := time.AfterFunc(g.cfg.RebalanceTimeout, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer timer.Stop()
	g.mu.Lock()
	gp.active = false
	clear(gp.recs)
	gp.recs = nil
	for gp.waiting && !g.closed && time.Now().Before(deadline) {
		g.cond.Wait()
	}
	dropped := gp.waiting && !g.closed
	if g.parts[gp.p] == gp {
		delete(g.parts, gp.p)
	}
	if dropped {
		g.pending[gp.p] = gp
	}
	g.mu.Unlock()
	if dropped {
		log.Warn("the batch in hand did not commit within the rebalance timeout: the partition is released, "+
			"and the batch's commit will be refused (fenced); this server claims the partition again only once the loop reports it", "committed", gp.committed, "yielded", gp.yielded)
	}
	if err := g.cfg.Store.ReleasePartition(context.WithoutCancel(g.ctx), g.cfg.Feed, gp.p); err != nil {
		log.Warn("releasing the partition", logErr, err)
	}
}

// Poll appends up to max ready records to buf, taking from the held
// partitions in turn; it blocks until one is ready, ctx is done or the
// feed closes (an error wrapping fs.ErrClosed).
func (g *GroupFeed) Poll(ctx context.Context, buf []ingest.Record, max int) ([]ingest.Record, error) {
	for {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			return buf, fmt.Errorf("poll kafka group feed %s: %w", g.cfg.Topic, fs.ErrClosed)
		}
		if !g.opened {
			g.mu.Unlock()
			return buf, fmt.Errorf("poll kafka group feed %s: not opened", g.cfg.Topic)
		}
		buf = g.take1(buf, max)
		g.mu.Unlock()
		if len(buf) > 0 {
			return buf, nil
		}
		select {
		case <-ctx.Done():
			return buf, ctx.Err()
		case <-g.ready:
		}
	}
}

// take1 moves records of the active partitions to buf, round robin. g.mu
// is held.
func (g *GroupFeed) take1(buf []ingest.Record, most int) []ingest.Record {
	ps := make([]int32, 0, len(g.parts))
	for p, gp := range g.parts {
		if gp.active && len(gp.recs) > 0 {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return buf
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	g.rr++
	share := max(1, (most-len(buf))/len(ps))
	for i := range ps {
		gp := g.parts[ps[(g.rr+i)%len(ps)]]
		n := min(share, len(gp.recs), most-len(buf))
		if n <= 0 {
			break
		}
		for _, r := range gp.recs[:n] {
			if r.Kind != ingest.RecordLoss { // a loss alone moves no position: its commit is fenced like any
				gp.yielded, gp.waiting = max(gp.yielded, r.Position), true
			}
		}
		buf = append(buf, gp.recs[:n]...)
		clear(gp.recs[:n])
		gp.recs = gp.recs[n:]
		signal(gp.space)
	}
	return buf
}

// Commit notes the positions the store now has: a revoked partition waits
// for them, and they are marked as the group's offsets for Kafka's tools.
func (g *GroupFeed) Commit(_ context.Context, through []outbox.Checkpoint) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range through {
		if gp := g.pending[c.Partition]; gp != nil && c.Epoch == gp.epoch {
			// committed before the release reached the store
			if gp.committed = max(gp.committed, c.Position); gp.committed >= gp.yielded {
				delete(g.pending, c.Partition)
			}
		}
		gp, ok := g.parts[c.Partition]
		if !ok {
			continue
		}
		if c.Epoch != gp.epoch {
			continue
		}
		gp.committed = max(gp.committed, c.Position)
		if gp.committed >= gp.yielded {
			gp.waiting = false
		}
		gp.sess.MarkOffset(g.cfg.Topic, c.Partition, c.Position, "")
	}
	g.cond.Broadcast()
	return nil
}

// Ends returns each held partition's high watermark as last seen.
func (g *GroupFeed) Ends() map[int32]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := make(map[int32]int64, len(g.parts))
	for p, gp := range g.parts {
		m[p] = max(gp.end, gp.committed)
	}
	return m
}

// Held returns the partitions the feed holds now, in order.
func (g *GroupFeed) Held() []int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	ps := make([]int32, 0, len(g.parts))
	for p := range g.parts {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

// Close leaves the group, releases the partitions and disconnects; a
// waiting Poll returns an error wrapping fs.ErrClosed. Closing twice
// returns nil.
func (g *GroupFeed) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.cond.Broadcast()
	g.mu.Unlock()
	signal(g.ready)
	g.stop()
	var errs []error
	if g.group != nil {
		errs = append(errs, g.group.Close())
	}
	g.wg.Wait()
	if g.consumer != nil {
		errs = append(errs, g.consumer.Close(), g.fetcher.Close(), g.client.Close())
	}
	return errors.Join(errs...)
}
