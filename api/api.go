// Package api is outboxd's HTTP API: per-feed status JSON, the outbox and
// relay status, dead letters and the operator actions on them, health and
// readiness probes, Prometheus metrics, an embedded dashboard, and the
// configured read-only state queries (GET /queries/{name}, run by the
// store: see outbox.Store.Query).
//
// Every status answer is read in one read transaction of the store (or
// from the feeds' and relay's in-memory state), so its figures come from
// one commit and serving it never waits for an ingest transaction; the API
// runs no SQL of its own. Readiness asks the store whether it can write,
// without writing. Every answer is bounded in bytes, and dead-letter
// requests are served a few at a time (see DeadLetterMemory). The API does not know the ingest loop or the relay:
// it sees them through the small Feed and Relay interfaces below, which the
// server's wiring adapts. Endpoints and fields are documented in
// openapi.yaml beside this file (served at /openapi.yaml).
package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/relaystatus"
	"github.com/outboxd/outboxd/outbox"
)

// Feed is one configured feed as the API sees it. Implementations must be
// safe for concurrent use: the API calls them from request goroutines while
// the feed runs.
type Feed interface {
	// Name is the feed's name, unique among the feeds.
	Name() string
	// Kind is "file" or "kafka".
	Kind() string
	// Source names what is read: a path, a topic.
	Source() string
	// Processor names the feed's processor.
	Processor() string
	// State returns the feed's state and its last error ("" when none). It
	// must not block. The API shows running and caught-up apart by the
	// positions it reads and the ends, not by what State says of them.
	State() (state outbox.FeedState, lastError string)
	// Ends returns the source's end per partition as last seen (a file's
	// size, a partition's high watermark). It must not block.
	Ends() map[int32]int64
	// Requeue feeds dead letter deadLetterID of this feed back through the
	// processor as a new delivery, recording who asked (r.By) and applying
	// r.Payload instead of the stored payload when it is not nil (an
	// operator's edit). It returns false, changing nothing, when the dead
	// letter was requeued or discarded already, and an error wrapping
	// outbox.ErrNotFound when the feed has no such dead letter. Any other
	// error (the processor failed again) leaves the dead letter as it was.
	Requeue(ctx context.Context, deadLetterID int64, r outbox.Requeue) (applied bool, err error)
}

// Relay is the outbox relay as the API sees it. A nil Relay means the relay
// is off. Status must be safe for concurrent use and must not block.
type Relay interface {
	Status() RelayStatus
}

// RelayStatus is a snapshot of the relay: the relay's own Status.
type RelayStatus = relaystatus.Status

// Config configures the HTTP server.
type Config struct {
	// Addr is the listen address (default 127.0.0.1:8080). Binding to
	// anything but a loopback address without an AdminToken, or without
	// TLS, logs a warning.
	Addr string
	// AdminToken, when set, enables the mutating endpoints (requeue a dead
	// letter, acknowledge losses) for requests carrying
	// "Authorization: Bearer <AdminToken>", the token named admin. Empty
	// disables them (403) unless Tokens has an admin token.
	AdminToken string
	// Tokens are the named tokens (ParseTokens) beside AdminToken: an
	// admin token may do everything, a read token read dead letters.
	Tokens []Token
	// Timeouts of the http.Server: reading a request's headers, reading the
	// whole request, writing the response, and keeping an idle connection.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxBody caps a request body in bytes; a larger body is answered 413.
	MaxBody int64
	// BatchMax and RelayBatchMax are the largest ingest batch and relay
	// transaction configured (default 4000): the last buckets of the
	// batch-size histograms.
	BatchMax, RelayBatchMax int
	// MaxBacklog is the outbox backlog's bound, for the outbox status and
	// the metrics (the ingest loops apply it).
	MaxBacklog outbox.BacklogLimit
	// TLS, when set, serves the API over TLS (HTTPS) with its
	// certificates; nil serves plain HTTP. Binding to anything but a
	// loopback address without it logs a warning.
	TLS *tls.Config
	// Queries are the named state queries served at /queries/{name}
	// (see queries.go), each run within QueryLimits (zero fields:
	// outbox.DefaultQueryLimits).
	Queries     []*outbox.Query
	QueryLimits outbox.QueryLimits
	// Starting, when set, says why the server is not running yet (it waits
	// to claim its database): while it returns a reason, the mutating
	// endpoints answer 503 and /readyz fails a "start" check with it.
	Starting func() string
	// HistoryEvery is how often an open server samples its history
	// (GET /history); 0 is HistoryInterval, below 0 none (a test that
	// samples with RecordHistory itself).
	HistoryEvery time.Duration
}

// defaultBatchMax is the size histograms' top bucket when none is configured.
const defaultBatchMax = 4000

// MinAdminTokenLen is the shortest admin token Validate accepts.
const MinAdminTokenLen = 16

// DefaultConfig returns the defaults: 127.0.0.1:8080, no admin token, 5s to
// read headers, 15s to read a request, 30s to write a response, 2m idle, and
// request bodies capped at 64 KiB.
func DefaultConfig() Config {
	return Config{
		Addr:              "127.0.0.1:8080",
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxBody:           64 << 10,
		BatchMax:          defaultBatchMax,
		RelayBatchMax:     defaultBatchMax,
	}
}

// Validate reports every invalid field, joined, each naming its flag.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--http: %q: want HOST:PORT: %w", c.Addr, err))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"read header timeout", c.ReadHeaderTimeout}, {"read timeout", c.ReadTimeout},
		{"write timeout", c.WriteTimeout}, {"idle timeout", c.IdleTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("http %s: %v, want more than 0", d.name, d.v))
		}
	}
	if c.MaxBody <= 0 {
		errs = append(errs, fmt.Errorf("http max body: %d, want more than 0", c.MaxBody))
	}
	if c.BatchMax < 1 || c.RelayBatchMax < 1 {
		errs = append(errs, fmt.Errorf("batch maxima %d and %d: want at least 1", c.BatchMax, c.RelayBatchMax))
	}
	if c.AdminToken != "" {
		if err := checkToken(c.AdminToken); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range c.Tokens {
		if err := checkToken(t.Secret); err != nil || !tokenName.MatchString(t.Name) || (t.Role != RoleAdmin && t.Role != RoleRead) {
			errs = append(errs, fmt.Errorf("token %q (role %q): want a name, the role admin or read, and a secret of at least %d bytes", t.Name, t.Role, MinAdminTokenLen))
		}
	}
	return errors.Join(errs...)
}

func checkToken(tok string) error {
	if len(tok) < MinAdminTokenLen {
		return fmt.Errorf("admin token: %d bytes, want at least %d", len(tok), MinAdminTokenLen)
	}
	if strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("admin token: contains spaces or control characters")
	}
	return nil
}

// loopback reports whether addr's host is a loopback address (or
// "localhost"). An empty host means every interface: not loopback.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
