package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox"
)

// relayIDKey is the store meta key of the relay's id.
const relayIDKey = "relay_id"

// Relay publishes a store's outbox to Kafka in id order. Run does the work;
// Status may be called from any goroutine at any time.
type Relay struct {
	store *outbox.Store
	cfg   Config
	base  *slog.Logger
	log   *slog.Logger
	st    *tracker

	running atomic.Bool

	// Where the database is: recorded in every progress record.
	dbPath, host string

	// Set by Run before anything is published.
	relayID string
	txnID   string
	kafka   *kafka

	// known holds the topics checked to exist in the current session, and
	// refused the rows a broker refused as too large in it (stored as dead
	// letters). Only the Run goroutine touches them.
	known   map[string]bool
	refused map[int64]bool

	// recorded is the last id stored as published in SQLite: pruning
	// never goes past it.
	recorded atomic.Int64
	rec      *recorder // exactly-once progress to SQLite
	pruneNow chan struct{}

	// spare is the record slab of the last batch that went out, for the
	// next one (see publish). Only the Run goroutine touches it.
	spare *recordSlab

	// progressChecked says the progress topic's settings were checked in
	// this Run. Only the Run goroutine touches it.
	progressChecked bool

	// denied is the last refusal logged ("" while allowed). Only the Run
	// goroutine touches it.
	denied string
}

// New makes a relay for store. It checks cfg but does not connect: Run does.
func New(store *outbox.Store, cfg Config) (*Relay, error) {
	if store == nil {
		return nil, errors.New("relay: a store is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("relay config: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "relay", "mode", cfg.Mode)
	host, _ := os.Hostname() // an unknown host name is empty: paths alone then tell databases apart
	return &Relay{
		store:    store,
		cfg:      cfg,
		dbPath:   store.AbsPath(),
		host:     host,
		base:     log,
		log:      log,
		st:       newTracker(cfg.Mode, store.Now),
		pruneNow: make(chan struct{}, 1),
	}, nil
}

// Status returns a snapshot of the relay. It is safe for concurrent use.
func (r *Relay) Status() Status { return r.st.snapshot() }

// Run publishes until ctx is done, then finishes or abandons the
// transaction in hand within Config.ShutdownTimeout and returns nil. While
// Kafka is unreachable or failing it backs off and tries again, without
// end. It returns early only when it must not go on without an operator:
// an error wrapping ErrFenced (another relay took over the transactional
// id) or ErrBackInTime (the database is older than Kafka's progress); the
// Status then says why. Run may be called again after it returns, but not
// concurrently.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run is already running")
	}
	defer r.running.Store(false)
	r.progressChecked = false
	r.st.update(func(s *Status) {
		s.State, s.Fenced, s.PublishedTotal, s.Transactions, s.Pruned, s.DeadLettered = StateStarting, false, 0, 0, 0, 0
	})
	if err := r.start(ctx); err != nil {
		r.st.failed(StateStopped, err)
		return err
	}
	defer r.kafka.close()
	stop, release := newStopping(ctx, r.cfg.ShutdownTimeout)
	defer release()
	defer r.startHelpers(stop)()

	err := r.loop(stop)
	r.st.update(func(s *Status) {
		s.Connected = false
		if err == nil {
			s.State = StateStopped
		}
	})
	return err
}

// start reads the relay's identity and makes the admin and progress
// client.
func (r *Relay) start(ctx context.Context) error {
	if err := r.identify(ctx); err != nil {
		return err
	}
	k, err := newKafka(r.cfg.Brokers, r.cfg.Kafka)
	if err != nil {
		return err
	}
	r.kafka = k
	return nil
}

// startHelpers starts the maintenance loop (until stop.soft is done) and
// the progress recorder, and returns the function that stops both. The
// recorder outlives stop.soft: it stops when that function is called,
// after the last transaction, with a last write bounded by stop.hard.
func (r *Relay) startHelpers(stop stopping) func() {
	mctx, stopMaintain := context.WithCancel(stop.soft)
	rctx, stopRecorder := context.WithCancel(context.WithoutCancel(stop.soft))
	r.rec = newRecorder(r.store, r.relayID, &r.recorded, r.log, r.prunePublished)
	var wg sync.WaitGroup
	wg.Go(func() { r.maintain(mctx) })
	wg.Go(func() { r.rec.run(rctx, stop.hard) })
	return func() {
		stopMaintain()
		stopRecorder()
		wg.Wait()
	}
}

// identify reads (or makes) the relay's id and derives the transactional id.
func (r *Relay) identify(ctx context.Context) error {
	id, err := r.store.MetaID(ctx, relayIDKey)
	if err != nil {
		return fmt.Errorf("relay id: %w", err)
	}
	r.relayID, r.txnID = id, r.cfg.TransactionalID
	if r.txnID == "" {
		r.txnID = "outboxd-" + id
	}
	r.log = r.base.With("relay_id", id)
	r.st.update(func(s *Status) {
		s.RelayID = id
		if r.cfg.Mode == ModeExactlyOnce {
			s.TransactionalID = r.txnID
		}
	})
	return nil
}

// loop runs sessions (one producer each) until the relay is asked to stop
// or one ends in a way that needs an operator.
func (r *Relay) loop(stop stopping) error {
	bo := &backoff.ExponentialBackOff{
		InitialInterval: r.cfg.MinBackoff, RandomizationFactor: 0.2,
		Multiplier: 2, MaxInterval: r.cfg.MaxBackoff,
	}
	bo.Reset()
	for {
		progressed, err := r.session(stop)
		if stop.asked() {
			if err != nil && !errors.Is(err, context.Canceled) {
				r.log.Warn("stopped with the last batch unfinished", "err", err)
			}
			return nil
		}
		if progressed {
			bo.Reset()
		}
		if err := r.mustStop(stop.soft, err); err != nil {
			return err
		}
		wait := r.failedSession(err, bo.NextBackOff())
		if clock.Sleep(stop.soft, wait) != nil {
			return nil
		}
	}
}

// failedSession records a session's failure and returns how long to wait
// before the next one: next, the longest backoff for a fatal error, or
// the unauthorized backoff for a refusal, which is logged once (and again
// only when it changes), so an operator sees one line, not a retry loop.
func (r *Relay) failedSession(err error, next time.Duration) time.Duration {
	class := Classify(err)
	if class != Unauthorized {
		if class == Fatal {
			next = r.cfg.MaxBackoff
		}
		r.st.failed(StateBackingOff, err)
		r.log.Warn("publishing failed; starting over", "err", err, "class", class, "retry_in", next)
		return next
	}
	r.st.failed(StateUnauthorized, err)
	if msg := err.Error(); msg != r.denied {
		r.denied = msg
		r.log.Error("Kafka refused the relay: nothing is published until an operator grants it; asking again every "+
			r.cfg.UnauthorizedBackoff.String(), "err", err)
	}
	return r.cfg.UnauthorizedBackoff
}

// checkAccess makes the session's first connection a check of the relay's
// credentials (kafkasec.Settings.Check), when it has any: a refused
// password or certificate then costs one connection per session, not one
// per retry of each client.
func (r *Relay) checkAccess(ctx context.Context) error {
	if r.cfg.Kafka.TLS == nil && r.cfg.Kafka.SASL.Mechanism == "" {
		return nil
	}
	return r.cfg.Kafka.Check(ctx, r.cfg.Brokers)
}

// mustStop returns the error Run ends with when err needs an operator, nil
// when the relay may try again. A relay fenced by another producer while
// its store still owns the database (a process that lost the claim fenced
// it on its way out, or the coordinator timed a transaction out) starts
// over with a new producer; one whose store lost the database stops.
func (r *Relay) mustStop(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrBackInTime):
		r.st.failed(StateRefusing, err)
		r.log.Error("refusing to publish", "err", err)
		return fmt.Errorf("relay: %w", err)
	case errors.Is(err, outbox.ErrFenced):
		return r.fenced(fmt.Errorf("%w: %w", ErrFenced, err))
	case Classify(err) == Fenced:
		if !r.store.Claimed() {
			return r.fenced(err) // no claim to tell who owns the database: stop, as a zombie must
		}
		switch oerr := r.store.CheckOwner(ctx); {
		case errors.Is(oerr, outbox.ErrFenced):
			return r.fenced(fmt.Errorf("%w: %w", err, oerr))
		case oerr != nil:
			r.log.Warn("fenced, and the database's owner cannot be read; trying again", "err", err, "owner_err", oerr)
		default:
			r.log.Warn("fenced by another producer while this process owns the database: starting over with a new producer",
				"transactional_id", r.txnID, "err", err)
		}
	}
	return nil
}

// fenced records that the relay stops because another one took over.
func (r *Relay) fenced(err error) error {
	r.st.failed(StateFenced, err)
	r.st.update(func(s *Status) { s.Fenced = true })
	r.log.Error("fenced: another process owns the database or the transactional id now; stopping",
		"transactional_id", r.txnID, "err", err)
	if !errors.Is(err, ErrFenced) {
		err = fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return fmt.Errorf("relay: %w", err)
}

// session opens a producer and publishes with it until the relay is asked
// to stop or an error ends it. progressed says whether it published
// anything.
func (r *Relay) session(stop stopping) (progressed bool, err error) {
	r.st.starting()
	r.known, r.refused = map[string]bool{}, map[int64]bool{}
	if err := r.checkAccess(stop.soft); err != nil {
		return false, err
	}
	if r.cfg.Mode == ModeAtLeastOnce {
		return r.runAtLeastOnce(stop)
	}
	return r.runExactlyOnce(stop)
}

// connected records a producer ready to publish after id last. A relay
// refused before stays unauthorized, with the refusal, until a batch
// goes out (allowed): the refusal may come again with the next batch.
func (r *Relay) connected(last int64) {
	r.recorded.Store(last)
	r.st.update(func(s *Status) {
		s.Connected = true
		s.LastPublishedID = max(s.LastPublishedID, last)
		if r.denied == "" {
			s.State, s.LastError, s.LastErrorAt = StateIdle, "", time.Time{}
		}
	})
}

// allowed records that a batch went out: a refusal logged before is over.
func (r *Relay) allowed() {
	if r.denied != "" {
		r.log.Info("Kafka allows the relay again: publishing", "was", r.denied)
		r.denied = ""
	}
}

// idle records that the relay waits for rows.
func (r *Relay) idle() { r.st.state(StateIdle) }

// dropProducer closes a session's producer. After a failure, a
// transactional producer is closed in the background: the next producer's
// initialisation fences whatever it still has in flight. An idempotent
// producer is not fenced, so the next session waits until its records have
// settled, or a late retry could land after newer records. At shutdown both
// get until stop.hard is done.
func (r *Relay) dropProducer(stop stopping, p interface{ close() }) {
	done := make(chan struct{})
	go func() {
		p.close()
		close(done)
	}()
	if r.cfg.Mode == ModeExactlyOnce && !stop.asked() {
		return
	}
	select {
	case <-done:
	case <-stop.hard.Done():
		r.log.Warn("the producer is still closing; leaving it to finish in the background")
	}
}
