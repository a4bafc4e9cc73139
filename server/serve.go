package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/forward"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/internal/devkafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// Main is the whole service: the store, a loop per feed, the relay and the
// dev broker when no brokers are configured. Tests run it in-process.
type Main struct {
	Config Config
	Logger *slog.Logger

	Store  *outbox.Store
	Loops  []*ingest.Loop
	Relay  *relay.Relay
	Broker *devkafka.Broker
	API    *api.Server
}

// NewMain returns a service for cfg; nothing is opened until Run.
func NewMain(cfg Config, logger *slog.Logger) *Main {
	return &Main{Config: cfg, Logger: logger}
}

// Run opens everything, runs until ctx is done, then stops the feeds (each
// commits its batch in hand), stops the relay and closes the store.
func (m *Main) Run(ctx context.Context) (err error) {
	if err := m.open(ctx); err != nil {
		m.close()
		return err
	}
	defer func() {
		if cerr := m.close(); err == nil {
			err = cerr
		}
	}()
	return m.serve(ctx)
}

func (m *Main) open(ctx context.Context) error {
	st := outbox.DefaultConfig(m.Config.DB)
	st.Synchronous = m.Config.Synchronous
	s, err := outbox.Open(ctx, st)
	if err != nil {
		return err
	}
	m.Store = s
	gen, err := s.Claim(ctx)
	if err != nil {
		return err
	}
	m.Logger.Info("database claimed: an older server on it is fenced at its next commit", "db", m.Config.DB, "generation", gen)
	seams, err := loadTestSeams(m.Logger)
	if err != nil {
		return err
	}
	seams.installCommitHook(s)
	if err := m.resolveBrokers(); err != nil {
		return err
	}
	for _, name := range m.Config.FeedNames() {
		l, err := m.newLoop(name, m.Config.Feeds[name], seams)
		if err != nil {
			return err
		}
		m.Loops = append(m.Loops, l)
	}
	if err := m.openRelay(ctx); err != nil {
		return err
	}
	return m.openAPI()
}

func (m *Main) newLoop(name string, fc *FeedConfig, seams testSeams) (*ingest.Loop, error) {
	kind, target, _ := strings.Cut(fc.Source, ":")
	var feed ingest.Feed
	switch kind {
	case "file":
		feed = filefeed.New(target, filefeed.Options{MaxLine: m.Config.MaxLine, Logger: m.Logger})
	case "kafka":
		kc := kafkafeed.Config{Brokers: m.Config.Brokers, Topic: target, Group: fc.Group, Logger: m.Logger}
		if fc.Processor == orders.Name {
			kc.Topics = []string{name + ".retry"}
		}
		feed = kafkafeed.New(kc)
	default:
		return nil, fmt.Errorf("feed %s: unknown kind %q", name, kind)
	}
	var proc ingest.Processor
	switch fc.Processor {
	case orders.Name:
		oc := orders.DefaultConfig(name, target)
		oc.StatusTopic = fc.Topic
		oc.RetryDelay, oc.RetryAttempts = m.Config.RetryDelay, m.Config.RetryAttempts
		oc.Logger = m.Logger
		p, err := orders.New(oc)
		if err != nil {
			return nil, fmt.Errorf("feed %s: %w", name, err)
		}
		proc = p
	case ledger.Name:
		proc = ledger.New(fc.Topic)
	case forward.Name:
		proc = forward.New(fc.Topic, fc.KeyField)
	default:
		return nil, fmt.Errorf("feed %s: unknown processor %q", name, fc.Processor)
	}
	cfg := ingest.DefaultConfig(name)
	cfg.Processor = fc.Processor
	cfg.BatchMax, cfg.BatchBytes, cfg.BatchWait = m.Config.BatchMax, m.Config.BatchBytes, m.Config.BatchWait
	cfg.OnFailure, cfg.OnCompletionFailure = fc.OnFailure, fc.OnCompletionFailure
	cfg.MaxMessageBytes = m.Config.MaxMessageBytes
	cfg.Logger = m.Logger
	cfg.OnBatch = func(records int, commit time.Duration) {
		if m.API != nil { // set before the loops run
			m.API.Metrics().ObserveBatch(name, records, commit)
		}
	}
	if fc.Processor == orders.Name {
		// The record's work deadline bounds each attempt; it is shorter than
		// the shutdown grace period, so a SIGTERM never cuts a record in half.
		cfg.Retry.AttemptTimeout = orders.DefaultWorkDeadline
	}
	cfg.DisableGuard = seams.disableGuard
	cfg.Rewind = seams.rewind[name]
	return ingest.NewLoop(m.Store, feed, proc, cfg)
}

// resolveBrokers starts the in-process dev broker when no --brokers are
// given and something needs Kafka (the relay, a Kafka feed).
func (m *Main) resolveBrokers() error {
	if len(m.Config.Brokers) > 0 || !m.needsKafka() {
		return nil
	}
	dir := m.Config.Relay.devBrokerDir(m.Config.DB)
	b, err := devkafka.StartWith(devkafka.Options{
		Addr: m.Config.Relay.DevBrokerAddr, DataDir: dir, AutoCreateTopics: true,
		Partitions: m.Config.Relay.TopicPartitions, Logger: m.Logger,
	})
	if err != nil {
		return fmt.Errorf("start the dev broker (give --brokers to use a real one): %w", err)
	}
	m.Broker = b
	m.Config.Brokers = []string{b.Addr()}
	if dir == "" {
		m.Logger.Warn("no --brokers: using an in-process dev broker; its data is IN MEMORY ONLY and lost at exit",
			"addr", b.Addr())
		return nil
	}
	m.Logger.Warn("no --brokers: using an in-process dev broker, for trying outboxd out; its log is kept on disk",
		"addr", b.Addr(), "data", dir)
	return nil
}

func (m *Main) needsKafka() bool {
	if m.Config.Relay.Mode != modeNone {
		return true
	}
	for _, f := range m.Config.Feeds {
		if strings.HasPrefix(f.Source, "kafka:") {
			return true
		}
	}
	return false
}

func (m *Main) openRelay(ctx context.Context) error {
	if m.Config.Relay.Mode == modeNone {
		m.Logger.Warn("the relay is off (--relay none): outputs stay in the outbox")
		return nil
	}
	rc := m.Config.Relay.relayConfig(m.Config.Brokers)
	rc.MaxMessageBytes = m.Config.MaxMessageBytes
	rc.Logger = m.Logger
	rc.OnTransaction = func(d time.Duration, records int) {
		if m.API != nil { // set before the relay runs
			m.API.Metrics().ObserveRelayTxn(d, records)
		}
	}
	r, err := relay.New(m.Store, rc)
	if err != nil {
		return err
	}
	m.Relay = r
	return nil
}

// serve runs the loops and the relay until ctx is done. A feed that stalls
// retries alone: the others and the status go on.
func (m *Main) serve(ctx context.Context) error {
	fatal := make(chan error, len(m.Loops)+1)
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var loops sync.WaitGroup
	for _, l := range m.Loops {
		loops.Add(1)
		go func() {
			defer loops.Done()
			// A stalled feed retries inside Run; Run returns an error only
			// when the feed cannot go on.
			if err := l.Run(loopCtx); err != nil {
				fatal <- fmt.Errorf("feed %s: %w", l.Name(), err)
			}
		}()
	}
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	relayDone := make(chan error, 1)
	if m.Relay != nil {
		go func() { relayDone <- m.relayRun(relayCtx, fatal) }()
	} else {
		relayDone <- nil
	}
	m.Logger.Info("outboxd running", "db", m.Config.DB, "feeds", len(m.Loops))
	var err error
	select {
	case <-ctx.Done():
	case err = <-fatal:
	}
	stopLoops()
	loops.Wait() // every loop has committed its batch in hand
	stopRelay()
	if rerr := <-relayDone; err == nil && rerr != nil {
		err = fmt.Errorf("relay: %w", rerr)
	}
	return err
}

// relayRun runs the relay until ctx is done. A fenced relay ends the whole
// process (another server owns the transactional id); one that refuses to
// publish (a database gone back in time) stays, so the status says why.
func (m *Main) relayRun(ctx context.Context, fatal chan<- error) error {
	err := m.Relay.Run(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, relay.ErrFenced):
		fatal <- fmt.Errorf("relay: %w", err)
		return nil
	default:
		m.Logger.Error("the relay stopped publishing; the feeds and the API go on", "err", err)
		<-ctx.Done()
		return nil
	}
}

func (m *Main) close() error {
	var errs []error
	errs = append(errs, m.closeAPI())
	if m.Store != nil {
		errs = append(errs, m.Store.Close())
	}
	if m.Broker != nil {
		errs = append(errs, m.Broker.Close())
	}
	return errors.Join(errs...)
}
