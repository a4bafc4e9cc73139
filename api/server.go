package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
)

// Server is the HTTP API. Create it with New, start it with Open, stop it
// with Close; or mount Handler in a test server. It is safe for concurrent
// use.
type Server struct {
	cfg    Config
	store  *outbox.Store
	feeds  map[string]Feed
	relay  Relay
	sinks  sinksField // the sinks' statuses (sinks.go); nil: none
	log    *slog.Logger
	tokens []tokenEntry // the configured tokens; none: what needs one is disabled

	metrics  *Metrics
	registry *prometheus.Registry
	handler  http.Handler

	// deadLetterTurns holds the turns of the dead-letter requests not
	// being served, each with its page buffer (nil until its first page);
	// a request waits deadLetterWait for one.
	deadLetterTurns chan []byte
	deadLetterWait  time.Duration

	queries *queries
	history *history
	kafka   Kafka // nil: no Kafka, GET /topics answers 404

	stopSampling context.CancelFunc // ends sampleHistory, started by Serve

	srv    *http.Server
	ln     net.Listener
	served sync.WaitGroup
}

// New checks cfg and returns a server over store, the configured feeds and
// the relay (nil when the relay is off). Zero fields of cfg take
// DefaultConfig's values; a nil logger means slog.Default(). Nothing
// listens until Open.
func New(cfg Config, store *outbox.Store, feeds []Feed, relay Relay, logger *slog.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("http api: %w", err)
	}
	if store == nil {
		return nil, errors.New("http api: no store")
	}
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{
		cfg: cfg, store: store, feeds: make(map[string]Feed, len(feeds)), relay: relay,
		log: logger.With("component", "api"), metrics: newMetrics(cfg),
		deadLetterTurns: make(chan []byte, DeadLetterConcurrency), deadLetterWait: deadLetterWait,
		history: newHistory(), stopSampling: func() {},
	}
	for range DeadLetterConcurrency {
		s.deadLetterTurns <- nil
	}
	for _, f := range feeds {
		if _, dup := s.feeds[f.Name()]; dup {
			return nil, fmt.Errorf("http api: feed %s given twice", f.Name())
		}
		s.feeds[f.Name()] = f
	}
	s.tokens = newTokenEntries(cfg)
	var err error
	if s.queries, err = newQueries(cfg.Queries, cfg.QueryLimits); err != nil {
		return nil, fmt.Errorf("http api: %w", err)
	}
	if s.registry, err = s.newRegistry(); err != nil {
		return nil, fmt.Errorf("http api: register metrics: %w", err)
	}
	s.handler = s.routes()
	s.srv = &http.Server{
		Addr:              cfg.Addr,
		Handler:           s.handler,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// withDefaults fills the zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Addr == "" {
		c.Addr = d.Addr
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = d.ReadHeaderTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = d.ReadTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = d.WriteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.MaxBody == 0 {
		c.MaxBody = d.MaxBody
	}
	if c.BatchMax == 0 {
		c.BatchMax = d.BatchMax
	}
	if c.RelayBatchMax == 0 {
		c.RelayBatchMax = d.RelayBatchMax
	}
	return c
}

// Handler is the API's handler, every middleware included: for tests
// (httptest.NewServer) or to mount elsewhere.
func (s *Server) Handler() http.Handler { return s.handler }

// Metrics is where the ingest loops and the relay report what the store
// does not keep (batch sizes, commit and transaction latencies).
func (s *Server) Metrics() *Metrics { return s.metrics }

// Registry is the Prometheus registry served at /metrics; more collectors
// may be registered on it.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Open listens on the configured address, so a bad or busy address is
// reported at once, and serves in the background until Close. Binding to
// a non-loopback address without an admin token logs a warning. Open (or
// Serve) may be called once.
func (s *Server) Open() error {
	if s.ln != nil {
		return errors.New("http api: already open")
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("http api: listen on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ln)
}

// Serve serves on ln, bound earlier (a service binds its port before it
// commits to running), in the background until Close, which closes ln.
// Open (or Serve) may be called once.
func (s *Server) Serve(ln net.Listener) error {
	if s.ln != nil {
		return errors.New("http api: already open")
	}
	addr := ln.Addr().String()
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	s.ln = ln
	s.warnExposed(addr)
	s.log.Info("HTTP API listening", logKeyAddr, addr, "tokens", len(s.tokens), "tls", s.cfg.TLS != nil)
	var sctx context.Context
	sctx, s.stopSampling = context.WithCancel(context.Background())
	s.served.Add(2)
	go func() {
		defer s.served.Done()
		s.sampleHistory(sctx)
	}()
	go func() {
		defer s.served.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("HTTP API stopped serving", logKeyErr, err)
		}
	}()
	return nil
}

// warnExposed warns when the API listens beyond loopback without an admin
// token or without TLS.
func (s *Server) warnExposed(addr string) {
	if loopback(s.cfg.Addr) {
		return
	}
	if len(s.tokens) == 0 {
		s.log.Warn("the HTTP API listens beyond loopback without an admin token: anyone who can reach it reads the status "+
			"(admin endpoints stay disabled)", logKeyAddr, addr)
	}
	if s.cfg.TLS == nil {
		s.log.Warn("the HTTP API listens beyond loopback without TLS: its answers, and the admin token of each admin "+
			"request, cross the network in clear (give --http-tls-cert and --http-tls-key, or put a TLS proxy in front)",
			logKeyAddr, addr)
	}
}

// URL is the base URL the server listens on ("http://127.0.0.1:PORT", or
// https with TLS), "" before Open or Serve.
func (s *Server) URL() string {
	if s.ln == nil {
		return ""
	}
	if s.cfg.TLS != nil {
		return "https://" + s.ln.Addr().String()
	}
	return "http://" + s.ln.Addr().String()
}

// Close stops accepting connections and waits for requests in flight to
// finish, until ctx is done; then it closes the remaining connections. It
// returns ctx's error when requests had to be cut off. Close before Open,
// or twice, returns nil.
func (s *Server) Close(ctx context.Context) error {
	if s.ln == nil {
		return nil
	}
	s.stopSampling()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
		err = fmt.Errorf("http api: shutdown: %w", err)
	}
	s.served.Wait()
	return err
}
