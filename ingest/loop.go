package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Config configures one feed's loop.
type Config struct {
	// Name is the feed's name, unique per store.
	Name string
	// Processor names the processor, for the status.
	Processor string
	// BatchMax closes a batch at this many records, BatchBytes once its
	// items' keys, values and headers hold this many bytes (0: the
	// default), BatchWait this long after its first record, whichever
	// comes first.
	BatchMax   int
	BatchBytes int
	BatchWait  time.Duration
	// Retry is the schedule for an item's transient errors; OnFailure says
	// what happens when it is spent (OnFailureDeadLetter or OnFailureStop).
	Retry     Retry
	OnFailure FailurePolicy
	// CommitRetry is the schedule for a batch whose transaction fails for
	// a passing reason (a busy database, an unknown error); a full disk, an
	// I/O error or a read-only database go to the policy at once.
	// OnCompletionFailure says what happens then (OnCompletionStop or
	// OnCompletionSkip).
	CommitRetry         Retry
	OnCompletionFailure CompletionPolicy
	// StallMaxDelay caps the wait between the tries of a stalled feed
	// (0: DefaultStallMaxDelay). The waits start at a second (or this,
	// when shorter) and double.
	StallMaxDelay time.Duration
	// DeadLetterTopic receives dead letters (default Name + ".dlq").
	DeadLetterTopic string
	// MaxMessageBytes is the largest record the relay publishes, as its
	// relay.Config.MaxMessageBytes counts it: a dead letter's Kafka copy
	// is cut to fit (see HeaderTruncated); the dead letter in the store is
	// whole. 0 means DefaultMaxMessageBytes.
	MaxMessageBytes int
	// MaxBacklog bounds the outbox backlog (the rows not yet published):
	// past it, the loop reads and applies nothing more, its state says
	// StateBackpressure, until the relay has published the backlog below
	// nine tenths of the bound. The backlog may pass the bound by a batch
	// per feed. The zero value sets no bound.
	MaxBacklog outbox.BacklogLimit
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnBatch, if set, is told the size (records) and commit time of every
	// committed batch, for metrics. It runs on the loop's goroutine.
	OnBatch func(records int, commit time.Duration)
	// Recorder, if set, keeps every record handled and each outcome, for
	// a replay (see Recorder).
	Recorder Recorder
}

// DefaultMaxMessageBytes is Config.MaxMessageBytes unless set: 1 MiB, as
// the relay's default.
const DefaultMaxMessageBytes = 1 << 20

// DefaultStallMaxDelay is the longest wait between the tries of a stalled
// feed: a freed disk is noticed within it.
const DefaultStallMaxDelay = 30 * time.Second

// DefaultBatchMax is Config.BatchMax unless set. A batch's commit writes
// each page it dirtied once, whatever number of its items touched it:
// with a state of millions of keys, where items dirty pages of their own,
// a bigger batch shares each page among more items (figures:
// docs/performance.md). At a moderate load batches close after Config.BatchWait, far below this
// size, so it costs no latency there.
const DefaultBatchMax = 16000

// DefaultBatchBytes bounds a batch's item bytes unless Config.BatchBytes
// says otherwise: 16,000 lines of 1 KiB, or 16 of the longest lines a
// file feed delivers whole.
const DefaultBatchBytes = 16 << 20

// DefaultMaxItemBytes is the largest item the loop expects from a feed that
// does not say (see ItemSizer): Kafka's default message.max.bytes, and the
// file feed's default longest line.
const DefaultMaxItemBytes = 1 << 20

// ItemSizer is implemented by feeds that know the largest item they can
// yield. The loop asks a feed for as many records as fit the batch's byte
// budget were each that large, so a batch holds at most BatchBytes plus one
// item, however its items' sizes vary up to that largest.
type ItemSizer interface {
	MaxItemBytes() int
}

// DefaultConfig returns the defaults for a feed named name.
func DefaultConfig(name string) Config {
	return Config{
		Name:                name,
		BatchMax:            DefaultBatchMax,
		BatchBytes:          DefaultBatchBytes,
		BatchWait:           5 * time.Millisecond,
		Retry:               DefaultRetry(),
		OnFailure:           OnFailureDeadLetter,
		CommitRetry:         DefaultRetry(),
		OnCompletionFailure: OnCompletionStop,
		MaxMessageBytes:     DefaultMaxMessageBytes,
		StallMaxDelay:       DefaultStallMaxDelay,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.Name == "" {
		return errors.New("feed name: empty")
	}
	if c.BatchMax < 1 {
		return fmt.Errorf("batch-max: %d, want at least 1", c.BatchMax)
	}
	if c.BatchBytes < 0 {
		return fmt.Errorf("batch-bytes: %d is negative", c.BatchBytes)
	}
	if c.BatchWait < 0 {
		return fmt.Errorf("batch-wait: %v is negative", c.BatchWait)
	}
	if c.MaxMessageBytes != 0 && c.MaxMessageBytes < outbox.MinMessageBytes {
		return fmt.Errorf("max-message-bytes: %d, want at least %d", c.MaxMessageBytes, outbox.MinMessageBytes)
	}
	if c.StallMaxDelay < 0 {
		return fmt.Errorf("stall max delay: %v is negative", c.StallMaxDelay)
	}
	if err := c.Retry.Validate(); err != nil {
		return fmt.Errorf("retry: %w", err)
	}
	if err := c.CommitRetry.Validate(); err != nil {
		return fmt.Errorf("commit retry: %w", err)
	}
	switch c.OnFailure {
	case OnFailureDeadLetter, OnFailureStop:
	default:
		return fmt.Errorf("on-failure: %q is not one of dead-letter, stop", c.OnFailure)
	}
	switch c.OnCompletionFailure {
	case OnCompletionStop, OnCompletionSkip:
	default:
		return fmt.Errorf("on-completion-failure: %q is not one of stop, skip", c.OnCompletionFailure)
	}
	return nil
}

// Setupper is implemented by processors that prepare their state (create
// tables, load caches) before the first item. Setup runs in its own
// transaction when the loop starts.
type Setupper interface {
	Setup(ctx context.Context, tx *outbox.Tx) error
}

// Loop applies one feed's records to one processor. Run it once.
type Loop struct {
	store *outbox.Store
	feed  Feed
	proc  Processor
	cfg   Config
	log   *slog.Logger

	cps   map[int32]outbox.Checkpoint // committed: the guard's authority
	seq   int64
	carry []Record // read but not yet taken into a batch
	// backlogged says the last batch closed full: the feed had more
	// ready than a batch holds (see collect).
	backlogged bool

	obs     observer      // told of each transaction: the recording, if any
	reqs    requests      // the requeues waiting for the loop's goroutine
	fatal   error         // set when a requeue met an error that ends the feed
	attempt sharedAttempt // the loop's items' attempt context
	maxItem int           // the feed's largest item, in bytes (see ItemSizer)
	// prepItems is the buffer of the items shown to a Preparer.
	prepItems []Item

	status loopStatus // what State reports
}

// NewLoop checks cfg and returns a loop; nothing is read until Run.
func NewLoop(store *outbox.Store, feed Feed, proc Processor, cfg Config) (*Loop, error) {
	if cfg.DeadLetterTopic == "" {
		cfg.DeadLetterTopic = cfg.Name + ".dlq"
	}
	if cfg.BatchBytes == 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	if cfg.StallMaxDelay == 0 {
		cfg.StallMaxDelay = DefaultStallMaxDelay
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("feed %s: %w", cfg.Name, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	maxItem := DefaultMaxItemBytes
	if s, ok := feed.(ItemSizer); ok && s.MaxItemBytes() > 0 {
		maxItem = s.MaxItemBytes()
	}
	var obs observer = noObserver{}
	if cfg.Recorder != nil {
		obs = recording{cfg.Recorder}
	}
	return &Loop{
		store: store, feed: feed, proc: proc, cfg: cfg, maxItem: maxItem, obs: obs,
		log:    log.With("component", "ingest", "feed", cfg.Name),
		status: loopStatus{phase: outbox.StateStopped},
	}, nil
}

// Name is the feed's name.
func (l *Loop) Name() string { return l.cfg.Name }

// Feed is the loop's feed.
func (l *Loop) Feed() Feed { return l.feed }

// Config is the loop's configuration.
func (l *Loop) Config() Config { return l.cfg }

// State returns the feed's state and its last error ("" when none). A
// moving feed is StateCaughtUp when every committed position is at or past
// the source's end as the feed sees it now, StateRunning otherwise, and
// StateWaiting, with the reason as its error, while its source is absent
// (see Waiter) and nothing else is wrong, and StateStalled while the
// source refuses the feed (see Troubler). Safe for concurrent use; it
// does not block.
func (l *Loop) State() (outbox.FeedState, string) {
	phase, lastError, positions, open := l.status.get()
	if phase != outbox.StateRunning {
		return phase, lastError
	}
	if t, ok := l.feed.(Troubler); ok {
		switch msg, stalls := t.Trouble(); {
		case msg != "" && stalls:
			return outbox.StateStalled, msg
		case msg != "" && lastError == "":
			lastError = msg
		}
	}
	if w, ok := l.feed.(Waiter); ok && lastError == "" {
		if why := w.Waiting(); why != "" {
			return outbox.StateWaiting, why
		}
	}
	if !open {
		return outbox.StateRunning, lastError // its ends are not known yet
	}
	return outbox.CaughtUpOrRunning(positions, l.feed.Ends()), lastError
}

// Dropper is a feed told when the loop drops records it yielded without
// committing them: a commit fenced because one of the batch's partitions
// moved to another server (outbox.ErrPartitionFenced). Dropped gets every
// record dropped; the feed yields again, from the positions the store has,
// the partitions among them it still holds, and nothing of the others.
type Dropper interface {
	Dropped(ctx context.Context, recs []Record)
}

// Run opens the feed right after the stored checkpoints and applies records
// until ctx is done; then it commits the batch in hand (unless the feed is
// stalled on it: then nothing of it is kept) and returns nil.
//
// A feed whose commits keep failing, or whose item keeps failing under the
// stop policy, stalls: its state says why, it retries with a backoff capped
// at Config.StallMaxDelay, and resumes by itself once the cause is gone.
// Run returns an error only when the feed cannot go on at all: it could not
// start (register, set up the processor, open the feed), the database is
// corrupt or gone, or another process claimed it (outbox.ErrFenced; not a
// group feed's partition moved to another server, outbox.ErrPartitionFenced:
// then the batch is dropped and the feed goes on, see Dropper). Then
// the state stays StateFailed with that error, and the error is logged.
// The feed is closed whatever happens.
func (l *Loop) Run(ctx context.Context) error {
	err := l.run(ctx)
	if err != nil && (ctx.Err() == nil || !errors.Is(err, ctx.Err())) {
		l.failed(err)
		return err
	}
	l.status.stop()
	return nil
}

func (l *Loop) run(ctx context.Context) error {
	defer l.closeFeed()
	defer l.obs.closed()
	defer l.attempt.stop()
	l.reqs.open()
	defer l.reqs.close(ErrNotRunning)
	if err := l.start(ctx); err != nil {
		return err
	}
	l.status.move()
	buf := make([]Record, 0, l.cfg.BatchMax)
	for {
		if err := l.serveRequeues(); err != nil {
			return err
		}
		if err := l.holdForBacklog(ctx); err != nil {
			if ctx.Err() != nil {
				return nil // ctx is done, between batches: nothing in hand
			}
			return err
		}
		batch, err := l.collect(ctx, buf[:0])
		if l.fatal != nil {
			return l.fatal // a requeue the feed asked for in its poll met it
		}
		if len(batch) > 0 {
			if err := l.process(ctx, batch); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if err := l.feedError(ctx, err); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// failed makes the feed's end loud: its state and error, and the log.
func (l *Loop) failed(err error) {
	l.status.fail(err)
	l.log.Error("feed failed: nothing more is applied until the process restarts", "err", err)
}

// closeFeed closes the feed, opened or not: a feed whose Open failed half
// way may hold a watcher or goroutines already.
func (l *Loop) closeFeed() {
	if err := l.feed.Close(); err != nil {
		l.log.Warn("closing the feed", "err", err)
	}
}

func (l *Loop) start(ctx context.Context) error {
	err := l.store.RegisterFeed(ctx, outbox.FeedInfo{
		Name: l.cfg.Name, Kind: l.feed.Kind(), Source: l.feed.Source(), Processor: l.cfg.Processor,
	})
	if err != nil {
		return fmt.Errorf("start feed %s: %w", l.cfg.Name, err)
	}
	if s, ok := l.proc.(Setupper); ok {
		if err := l.setup(ctx, s); err != nil {
			return err
		}
	}
	if err := l.readPositions(ctx); err != nil {
		return err
	}
	l.status.committed(l.cps)
	from := make(map[int32]outbox.Checkpoint, len(l.cps))
	for p, c := range l.cps {
		from[p] = c
		l.log.Info("resuming", "partition", p, "epoch", c.Epoch, "position", c.Position)
	}
	// Opening a Kafka feed waits for the brokers; meanwhile the state
	// says what the feed meets (a refusal: see Troubler), not stopped,
	// and running, not caught up: the source's ends are not known yet.
	l.status.move()
	if err := l.feed.Open(ctx, from); err != nil {
		return fmt.Errorf("open feed %s: %w", l.cfg.Name, err)
	}
	l.status.opened()
	return nil
}

// readPositions reads the committed checkpoints and starts the recording
// from them (no requeue is served before the feed opens, so none changes
// the state in between).
func (l *Loop) readPositions(ctx context.Context) error {
	var err error
	if l.cps, err = l.store.Positions(ctx, l.cfg.Name); err != nil {
		return fmt.Errorf("start feed %s: %w", l.cfg.Name, err)
	}
	l.obs.started(ctx, l.cps)
	return nil
}

func (l *Loop) setup(ctx context.Context, s Setupper) error {
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return fmt.Errorf("set up processor of %s: %w", l.cfg.Name, err)
	}
	defer tx.Rollback()
	if err := s.Setup(ctx, tx); err != nil {
		return fmt.Errorf("set up processor of %s: %w", l.cfg.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("set up processor of %s: %w", l.cfg.Name, err)
	}
	return nil
}

// feedError waits a little after a feed error, so a failing source is not
// spun on. It returns the error that ends the feed, met by a requeue
// served meanwhile, or ctx's.
func (l *Loop) feedError(ctx context.Context, err error) error {
	l.log.Error("reading feed", "err", err)
	l.status.setError(err)
	return l.wait(ctx, time.Second)
}

// collect gathers one batch: it blocks for the first record, then takes
// what the feed has ready until BatchMax records or BatchBytes, and closes
// the batch as soon as the feed has nothing more to give (a Poll returns
// fewer records than asked, or none at once), so a line appended at a
// modest rate waits for no batch built for full speed. A feed that keeps
// up fills its batch at once; while batches close full (the feed has a
// backlog), the next one waits up to BatchWait for the records still
// coming, as a batch did before batches adapted. A batch ends right after
// an epoch change or a loss, so they are stored before the records that
// follow them are applied, and early when a requeue comes, so it is
// applied soon.
func (l *Loop) collect(ctx context.Context, buf []Record) ([]Record, error) {
	buf = append(buf, l.carry...)
	l.carry = l.carry[:0]
	var c batchFill
	c.add(buf)
	pctx, done := l.pollContext(ctx)
	defer done()
	short := false // the last poll gave fewer records than asked
	if len(buf) == 0 {
		var err error
		want := l.pollMax(&c)
		if buf, err = l.feed.Poll(pctx, buf, want); err != nil {
			if woken(ctx, pctx) {
				return l.cutAtControl(buf), nil
			}
			return buf, err
		}
		short = len(buf) < want
		c.add(buf)
	}
	var err error
	switch {
	case l.cfg.BatchWait <= 0:
		// A batch is what the first poll gave.
	case l.backlogged:
		buf, err = l.fillWaiting(ctx, pctx, buf, &c)
	default:
		buf, err = l.fillReady(ctx, pctx, buf, &c, short)
	}
	if err != nil {
		return buf, err
	}
	// A batch that closed full says the feed has more than a batch ready:
	// the next waits for its records rather than close at a short poll.
	l.backlogged = l.full(&c)
	return l.cutAtControl(buf), nil
}

// full reports whether the batch c follows has no room left.
func (l *Loop) full(c *batchFill) bool {
	return c.seen >= l.cfg.BatchMax || c.bytes >= l.cfg.BatchBytes
}

// fillReady adds to buf the records the feed has ready now, without
// waiting: it stops at a poll that gives fewer than asked (short: the
// first already did), or none.
func (l *Loop) fillReady(ctx, pctx context.Context, buf []Record, c *batchFill, short bool) ([]Record, error) {
	var now context.Context // pctx, done: a Poll that does not wait
	for !short && !l.full(c) && !c.control && pctx.Err() == nil {
		if now == nil {
			var cancel context.CancelFunc
			now, cancel = context.WithCancel(pctx)
			cancel()
		}
		want := l.pollMax(c)
		had := len(buf)
		var err error
		buf, err = l.feed.Poll(now, buf, want)
		c.add(buf)
		if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil && pctx.Err() == nil {
			return buf, err
		}
		short = err != nil || len(buf)-had < want
	}
	return buf, nil
}

// fillWaiting adds to buf what the feed yields within BatchWait of now.
func (l *Loop) fillWaiting(ctx, pctx context.Context, buf []Record, c *batchFill) ([]Record, error) {
	deadline := time.Now().Add(l.cfg.BatchWait)
	dctx, cancel := context.WithDeadline(pctx, deadline)
	defer cancel()
	for !l.full(c) && !c.control && dctx.Err() == nil {
		if time.Now().After(deadline) {
			break
		}
		var err error
		buf, err = l.feed.Poll(dctx, buf, l.pollMax(c))
		c.add(buf)
		if err != nil {
			if ctx.Err() == nil && pctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				return buf, err
			}
			break
		}
	}
	return buf, nil
}

// batchFill follows what a batch being collected holds.
type batchFill struct {
	seen    int  // records counted
	bytes   int  // their items' bytes
	control bool // one is not an item (an epoch change, a loss)
}

// add counts the records of buf not counted yet.
func (c *batchFill) add(buf []Record) {
	for _, r := range buf[c.seen:] {
		if r.Kind != RecordItem {
			c.control = true
		}
		c.bytes += itemBytes(r.Item)
	}
	c.seen = len(buf)
}

func itemBytes(it Item) int {
	n := len(it.Key) + len(it.Value)
	for _, h := range it.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// pollMax is how many records to ask the feed for: what the batch has room
// for, in records and in bytes were every record as large as the feed's
// largest.
func (l *Loop) pollMax(c *batchFill) int {
	return max(1, min(l.cfg.BatchMax-c.seen, (l.cfg.BatchBytes-c.bytes)/l.maxItem))
}

// cutAtControl keeps records up to the first epoch change or loss and sets
// the rest aside for the next batch.
func (l *Loop) cutAtControl(buf []Record) []Record {
	for i, r := range buf {
		if r.Kind != RecordItem {
			l.carry = append(l.carry, buf[i+1:]...)
			return buf[:i+1]
		}
	}
	return buf
}
