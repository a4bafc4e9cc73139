package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/internal/devkafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/sink"
)

// Main is the whole service: the store, a loop per feed, the relay and the
// dev broker when no brokers are configured. Tests run it in-process.
type Main struct {
	Config Config
	Logger *slog.Logger

	Store  *outbox.Store
	Loops  []*ingest.Loop
	Relay  *relay.Relay
	leader *relay.Leader  // runs Relay while this server holds the relay's lease, when servers share the database
	Sinks  []*sink.Runner // the targets besides Kafka (sinks.go)
	Broker *devkafka.Broker
	API    *api.Server

	// listener is the HTTP port, bound before the database is claimed
	// and served from once it is.
	listener net.Listener
	// ready is closed once the API serves and the feeds and the relay
	// run (never, for a Run that stopped earlier).
	ready chan struct{}
	// backlog is the outbox backlog's bound, settled when the database
	// opens.
	backlog outbox.BacklogLimit
	// backlogHow says where the bound came from, for the start-up line.
	backlogHow string
	// queries are the state queries the API serves (queries.go).
	queries []*outbox.Query
	// starting says, while the API serves before the database is claimed,
	// what the start waits for ("" once claimed): see open.
	starting atomic.Pointer[string]
	// seams are the test seams installed (testseams_on.go); none in the
	// shipped binary.
	seams testSeams
}

// NewMain returns a service for cfg; nothing is opened until Run.
func NewMain(cfg Config, logger *slog.Logger) *Main {
	return &Main{Config: cfg, Logger: logger, ready: make(chan struct{})}
}

// Ready is closed once Run serves: the database claimed, the API
// listening, the feeds and the relay started.
func (m *Main) Ready() <-chan struct{} { return m.ready }

// URL is the HTTP API's base URL ("http://127.0.0.1:PORT") once Run has
// bound its port, "" before.
func (m *Main) URL() string {
	if m.listener == nil {
		return ""
	}
	if m.Config.HTTPTLS.TLS != nil {
		return "https://" + m.listener.Addr().String()
	}
	return "http://" + m.listener.Addr().String()
}

// Run starts the service, serves until ctx is done, then stops the feeds
// (each commits its batch in hand), stops the relay and closes the store.
//
// It checks everything it can before it claims the database, since a
// claim fences any server already running on it: the configuration's
// files, the HTTP port (bound), the dev broker (started), and, for a
// database that never published, the relay's check that no earlier
// database at its path did. A failure there is a *ConfigError and leaves
// such a server alone. Then it claims the database and runs until ctx is
// done, the database is lost (an error wrapping outbox.ErrMoved or
// outbox.ErrFenced), or a feed or the relay fails. A ctx done while it
// starts stops it cleanly: Run returns nil, without claiming the database
// if it had not yet.
func (m *Main) Run(ctx context.Context) (err error) {
	defer func() {
		if cerr := m.close(); err == nil {
			err = cerr
		}
		if err == nil && m.Store != nil && m.Store.Claimed() {
			m.Logger.Info("outboxd stopped", "db", m.Config.shownDB())
		}
	}()
	if err := m.open(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil || m.Store == nil || !m.Store.Claimed() {
		m.Logger.Info("stopped while starting")
		return nil
	}
	err = m.serve(ctx)
	if errors.Is(err, outbox.ErrMoved) {
		err = m.rescue(context.WithoutCancel(ctx), err)
	}
	return err
}

// rescue saves a copy of a database whose file was deleted or replaced
// under the server, beside its path: what the server committed lives only
// in the files it still has open, and is gone once it exits. Restored to
// the path, the copy goes on exactly once. It returns moved, saying where
// the copy is (or why there is none).
func (m *Main) rescue(ctx context.Context, moved error) error {
	path := fmt.Sprintf("%s.rescued-%s", m.Config.DB, m.Store.Now().UTC().Format("20060102T150405Z"))
	if err := m.Store.SaveCopy(ctx, path); err != nil {
		return fmt.Errorf("%w; no copy of it could be saved: %v", moved, err)
	}
	return fmt.Errorf("%w; a copy of the database as this server had it is saved at %s: to go on from it exactly once, "+
		"with no server running on %s, run: %s", moved, path, m.Config.DB, restoreCommand(path, m.Config.DB))
}

// restoreCommand is the shell command that puts the rescued copy at path
// back in place of db.
func restoreCommand(path, db string) string {
	return "mv " + shellQuote(path) + " " + shellQuote(db)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == ':' || r == '+' || r == '=' || r == ',' ||
			('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// rescuedCopy returns the newest copy a server rescued beside db (see
// rescue), "" when there is none.
func rescuedCopy(db string) string {
	copies, _ := filepath.Glob(db + ".rescued-*") // the pattern is well formed
	newest := ""
	for _, c := range copies {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() && c > newest { // named by UTC time: the newest sorts last
			newest = c
		}
	}
	return newest
}

// open prepares everything, claims the database and opens the API. It
// returns nil early, without claiming, when ctx is done.
func (m *Main) open(ctx context.Context) error {
	if err := m.preflight(); err != nil {
		return err
	}
	// Each step is short and bounded; a signal is looked at between them,
	// so it never fails a step half-way.
	steps := context.WithoutCancel(ctx)
	st := outbox.DefaultConfig(m.Config.DB)
	st.Synchronous = m.Config.Synchronous
	if m.Config.Shared() {
		st.IdleInTxTimeout = sharedIdleInTx
	}
	s, err := outbox.Open(steps, st)
	if err != nil {
		return err
	}
	m.Store = s
	if err := m.guardSQL(steps, s); err != nil {
		return err
	}
	plans, err := m.checkProcessors(steps)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := m.settleBacklog(); err != nil {
		return err
	}
	if len(m.Config.Brokers) > 0 && m.Broker == nil {
		warnKafka(m.Logger, m.Config.Kafka.Settings)
	}
	if err := m.loadQueries(steps); err != nil {
		return err
	}
	if err := m.build(); err != nil {
		return err
	}
	m.setStarting("claiming the database")
	if err := m.checkDatabaseServing(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	if m.API.URL() == "" {
		if err := m.API.Serve(m.listener); err != nil {
			return err
		}
	}
	if m.Config.Shared() {
		if err := s.Share(steps, m.serverID(), m.API.URL()); err != nil {
			return err
		}
		m.setStarting("")
		m.Logger.Info("database shared: this server takes the partitions its consumer groups assign it",
			"db", redactURL(m.Config.DB), "server", m.serverID())
		return m.recordProcessors(steps, plans)
	}
	gen, err := s.Claim(steps)
	if err != nil {
		return err
	}
	m.setStarting("")
	if gen == 1 {
		m.Logger.Info("database claimed: the first server on it", "db", m.Config.shownDB(), "generation", gen)
	} else {
		m.Logger.Info("database claimed: an older server on it, if one still runs, is fenced at its next commit",
			"db", m.Config.shownDB(), "generation", gen)
	}
	return m.recordProcessors(steps, plans)
}

// serverID is this server's name among those sharing the database
// (--server-id, default HOST-PID).
func (m *Main) serverID() string {
	if m.Config.ServerID != "" {
		return m.Config.ServerID
	}
	host, _ := os.Hostname() // "" names no host: the pid still tells servers apart
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// setStarting sets what the start waits for, "" once the database is
// claimed.
func (m *Main) setStarting(why string) { m.starting.Store(&why) }

// startingReason is what the start waits for, "" once it runs.
func (m *Main) startingReason() string {
	if p := m.starting.Load(); p != nil {
		return *p
	}
	return ""
}

// settleBacklog sets the outbox backlog's bound, from the flags or the
// free space, and says what it is.
func (m *Main) settleBacklog() error {
	dir := filepath.Dir(m.Config.DB)
	if outbox.IsPostgres(m.Config.DB) {
		dir = "" // the outbox is on the server's disk, not measured from here
	}
	lim, how, err := m.Config.Backlog.limit(dir, m.Config.Relay.Mode == modeNone)
	if err != nil {
		return configErr("%w", err)
	}
	m.backlog = lim
	if lim.IsZero() {
		m.Logger.Warn("the outbox backlog has no bound: while Kafka is away it grows until the disk is full", "bound", how)
		return nil
	}
	m.backlogHow = how // in the start-up line
	return nil
}

// build makes the loops, the relay and the API, opening nothing.
func (m *Main) build() error {
	if err := m.installTestSeams(); err != nil {
		return err
	}
	for _, name := range m.Config.FeedNames() {
		l, err := m.newLoop(name, m.Config.Feeds[name])
		if err != nil {
			return err
		}
		m.Loops = append(m.Loops, l)
	}
	if err := m.newRelay(); err != nil {
		return err
	}
	if err := m.newSinks(); err != nil {
		return err
	}
	return m.newAPI()
}

// serveAfter is how long a start waits for the new-database check before
// it serves the API anyway; it serves at once when the relay reports a
// failure. A check that ends sooner (it passes, or refuses: one line,
// exit code 2) never serves.
const serveAfter = 2 * time.Second

// checkDatabaseServing runs checkDatabase, and serves the API while the
// check waits for Kafka, read-only until the claim: such a first start
// shows why it waits, as a running server does (the relay's state and
// lastError), instead of leaving its port silent. The API's mutating
// endpoints answer 503 until the claim: another server may own the
// database meanwhile.
func (m *Main) checkDatabaseServing(ctx context.Context) error {
	if m.Relay == nil || m.Config.Relay.Mode != string(relay.ModeExactlyOnce) {
		return nil
	}
	m.setStarting("checking, on the progress topic, that this database does not replace one that published " +
		"(the relay's state and lastError say what Kafka answers)")
	done := make(chan error, 1)
	go func() { done <- m.checkDatabase(ctx) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(serveAfter)
	var serveErr error
	for served := false; ; {
		select {
		case err := <-done:
			return errors.Join(err, serveErr)
		case <-tick.C:
		}
		if served || (time.Now().Before(deadline) && m.Relay.Status().LastError == "") {
			continue
		}
		served = true
		serveErr = m.API.Serve(m.listener) // an error ends the start once the check has
	}
}

// checkDatabase runs the relay's check that a database that never
// published is not the replacement of one that did. It may wait for
// Kafka; a ctx done first ends it without error.
func (m *Main) checkDatabase(ctx context.Context) error {
	if m.Relay == nil {
		return nil
	}
	err := m.Relay.CheckDatabase(ctx)
	switch {
	case ctx.Err() != nil:
		return nil
	case errors.Is(err, relay.ErrNewDatabase):
		if c := rescuedCopy(m.Config.DB); c != "" {
			return configErr("%w; the newest copy a server rescued when its database was deleted or replaced is %s: "+
				"to go on from it exactly once, run: %s (it replaces the database now at that path, which never published), then start again; "+
				"or start this one once with --new-database to start afresh (every output is then published again)",
				err, c, restoreCommand(c, m.Config.DB))
		}
		return configErr("%w; restore that database, or start this one once with --new-database to start afresh "+
			"(every output is then published again)", err)
	}
	return err
}

func (m *Main) newLoop(name string, fc *FeedConfig) (*ingest.Loop, error) {
	kind, target, _ := strings.Cut(fc.Source, ":")
	proc, err := newProcessor(name, target, fc, m.Config, m.Logger)
	if err != nil {
		return nil, &ConfigError{Err: err} // before the claim: a server on the database is untouched
	}
	feed, err := m.newFeed(name, fc, kind, target, proc)
	if err != nil {
		return nil, err
	}
	feed = m.seamFeed(name, feed)
	cfg := ingest.DefaultConfig(name)
	cfg.Processor = fc.Processor
	cfg.BatchMax, cfg.BatchBytes, cfg.BatchWait = m.Config.BatchMax, m.Config.BatchBytes, m.Config.BatchWait
	cfg.OnFailure, cfg.OnCompletionFailure = fc.OnFailure, fc.OnCompletionFailure
	cfg.MaxMessageBytes = m.Config.MaxMessageBytes
	cfg.MaxBacklog = m.backlog
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
	if cfg.Recorder, err = m.newRecorder(name, fc, cfg); err != nil {
		return nil, err
	}
	return ingest.NewLoop(m.Store, feed, proc, cfg)
}

// newProcessor makes feed name's processor with the factory registered
// under fc.Processor; target is what the feed reads (a path, a topic).
func newProcessor(name, target string, fc *FeedConfig, c Config, logger *slog.Logger) (ingest.Processor, error) {
	if c.declaredProcessor(fc.Processor) {
		return newSQLProcessor(name, fc, c)
	}
	procs := c.processors()
	if err := procs.check(fc.Processor); err != nil {
		return nil, fmt.Errorf("feed %s: %w", name, err)
	}
	kind, _, _ := strings.Cut(fc.Source, ":")
	p, err := procs.make[fc.Processor](ProcessorSpec{
		Feed: name, Processor: fc.Processor, Topic: fc.Topic, Kind: kind, Target: target,
		KeyField: fc.KeyField, Logger: logger, Config: c,
	})
	switch {
	case err != nil:
		return nil, fmt.Errorf("feed %s: processor %s: %w", name, fc.Processor, err)
	case p == nil:
		return nil, fmt.Errorf("feed %s: processor %s: its factory made none", name, fc.Processor)
	}
	return p, nil
}

// warnSharedDir warns when the file a feed tails lives in the database's
// directory: the file feed watches its file's directory, so every write of
// the database and its WAL there wakes the watch (at 1,000,000 accounts
// the ledger spends about a fifth more CPU per line that way).
func (m *Main) warnSharedDir(feed, file string) {
	if outbox.IsPostgres(m.Config.DB) {
		return
	}
	fd, err1 := filepath.Abs(filepath.Dir(file))
	dd, err2 := filepath.Abs(filepath.Dir(m.Config.DB))
	if err1 == nil && err2 == nil && fd == dd {
		m.Logger.Warn("the feed's file is in the database's directory: every database write wakes the feed's file watch; keep them in different directories",
			"feed", feed, "file", file, "db", m.Config.shownDB())
	}
}

// newFeed makes the feed of kind reading target. A Kafka feed also reads
// the retry topic of a processor that has one (ingest.RetryTopicUser).
func (m *Main) newFeed(name string, fc *FeedConfig, kind, target string, proc ingest.Processor) (ingest.Feed, error) {
	retry := ""
	if u, ok := proc.(ingest.RetryTopicUser); ok {
		retry = u.RetryTopic()
	}
	switch kind {
	case "file":
		if retry != "" {
			return nil, fmt.Errorf("feed %s: processor %s sends items to the retry topic %s, which only a Kafka feed reads back",
				name, fc.Processor, retry)
		}
		return filefeed.New(target, filefeed.Options{
			MaxLine: m.Config.MaxLine, AssumeNoUnseenWrites: m.Config.FileAssumeNoUnseenWrites, Logger: m.Logger,
		}), nil
	case "kafka":
		kc := kafkafeed.Config{Brokers: m.Config.Brokers, Topic: target, Group: fc.Group, Logger: m.Logger,
			Kafka: m.Config.Kafka.Settings}
		if fc.KafkaGroup != "" {
			if retry != "" {
				return nil, fmt.Errorf("feed %s: processor %s sends items to the retry topic %s, which a feed shared by a consumer group "+
					"(--kafka-group) does not read yet", name, fc.Processor, retry)
			}
			kc.Group = fc.KafkaGroup
			return kafkafeed.NewGroup(kafkafeed.GroupConfig{Config: kc, Feed: name, Store: m.Store, Owner: m.serverID()}), nil
		}
		if retry != "" {
			kc.Topics = []string{retry}
		}
		return kafkafeed.New(kc), nil
	}
	return nil, fmt.Errorf("feed %s: unknown kind %q", name, kind)
}

// resolveBrokers starts the in-process dev broker when no --brokers are
// given and something needs Kafka (the relay, a Kafka feed).
func (m *Main) resolveBrokers() error {
	if len(m.Config.Brokers) > 0 || !m.needsKafka() {
		return nil
	}
	dir := m.Config.DevBroker.dir(m.Config.DB)
	b, err := devkafka.StartWith(devkafka.Options{
		Addr: m.Config.DevBroker.Addr, DataDir: dir, AutoCreateTopics: true,
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

func (m *Main) newRelay() error {
	if m.Config.Relay.Mode == modeNone {
		m.Logger.Warn("the relay is off (--relay none): outputs stay in the outbox")
		return nil
	}
	rc := m.Config.Relay.relayConfig(m.Config.Brokers)
	rc.MaxMessageBytes = m.Config.MaxMessageBytes
	rc.NewDatabase = m.Config.NewDatabase
	rc.Kafka = m.Config.Kafka.Settings
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
	m.newLeader()
	return nil
}

// serve runs the loops, the relay and the database watchdog until ctx is
// done or one of them fails. A feed that stalls retries alone, and one that
// fails stays failed alone: the others and the status go on.
func (m *Main) serve(ctx context.Context) error {
	fatal := make(chan error, len(m.Loops)+2)
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var loops sync.WaitGroup
	for _, l := range m.Loops {
		loops.Go(func() { m.runLoop(loopCtx, l, fatal) })
	}
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	relayDone := make(chan error, 1)
	if m.Relay != nil {
		go func() { relayDone <- m.relayRun(relayCtx, fatal) }()
	} else {
		relayDone <- nil
	}
	sinkCtx, stopSinks := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSinks()
	waitSinks := m.runSinks(sinkCtx)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	// The watchdog and the checkpoints end before serve returns, so none of
	// them touches the store once Run closes it.
	var watchers sync.WaitGroup
	watchers.Go(func() {
		if err := watchDatabase(watchCtx, m.Store, watchEvery); err != nil {
			fatal <- err
		}
	})
	watchers.Go(func() { m.checkpoints(watchCtx, checkpointEvery) })
	watchers.Go(func() { m.heartbeat(watchCtx) })
	m.logSummary(ctx)
	close(m.ready)
	var err error
	select {
	case <-ctx.Done():
	case err = <-fatal:
	}
	stopWatch()
	watchers.Wait()
	stopLoops()
	loops.Wait() // every loop has committed its batch in hand
	stopRelay()
	stopSinks()
	waitSinks()
	if rerr := <-relayDone; err == nil && rerr != nil {
		err = fmt.Errorf("relay: %w", rerr)
	}
	return err
}

// runLoop runs one feed's loop and reports a failure that must end the
// process. One that ends while the loops are being stopped (a feed still
// opening when the signal came, say) is part of the shutdown, unless it
// says the database was lost.
func (m *Main) runLoop(ctx context.Context, l *ingest.Loop, fatal chan<- error) {
	err := l.Run(ctx)
	switch {
	case err == nil:
	case errors.Is(err, outbox.ErrFenced):
		fatal <- fmt.Errorf("feed %s: %w", l.Name(), err)
	case ctx.Err() != nil:
		m.Logger.Warn("feed stopped while shutting down", "feed", l.Name(), "err", err)
	default:
		// Its state says failed, with the error; /readyz answers 503.
		m.Logger.Error("feed failed; the other feeds go on", "feed", l.Name(), "err", err)
	}
}

// relayRun runs the relay until ctx is done. A fenced relay ends the whole
// process (it stops only once another server owns the database); one that
// refuses to publish (a database gone back in time) stays, so the status
// says why.
func (m *Main) relayRun(ctx context.Context, fatal chan<- error) error {
	err := m.relayRunner()(ctx)
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
	if m.listener != nil && (m.API == nil || m.API.URL() == "") {
		m.listener.Close() // bound, never served
	}
	m.closeQueries()
	m.closeSinks()
	if m.Store != nil {
		errs = append(errs, m.Store.Close())
	}
	if m.Broker != nil {
		errs = append(errs, m.Broker.Close())
	}
	return errors.Join(errs...)
}
