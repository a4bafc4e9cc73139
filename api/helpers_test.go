package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/testseam"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// testToken is the admin token of the test servers.
const testToken = "test-admin-token-0123456789"

// readerToken is a read token every harness has: dead letters are read
// with it.
const readerToken = "test-reader-token-0123456789"

// withReader adds the read token to cfg.
func withReader(cfg api.Config) api.Config {
	cfg.Tokens = append(cfg.Tokens, api.Token{Name: "reader", Role: api.RoleRead, Secret: readerToken})
	return cfg
}

// clock is the fixed time of the test stores, so every stored time and age
// is exact.
var clock = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openStore opens a store on a file in t.TempDir() (a PostgreSQL database
// of its own under OUTBOXD_TEST_STORE=postgres) whose clock stands at
// clock.
func openStore(t *testing.T) *outbox.Store {
	t.Helper()
	return outboxtest.NewStore(t, func(cfg *outbox.Config) { cfg.Now = func() time.Time { return clock } })
}

// loopFeed adapts a running ingest.Loop to api.Feed, as cmd/server does.
// The loop can be replaced (a restart) while the API serves.
type loopFeed struct {
	mu sync.Mutex
	l  *ingest.Loop
}

var _ api.Feed = (*loopFeed)(nil)

func (f *loopFeed) loop() *ingest.Loop {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.l
}

func (f *loopFeed) set(l *ingest.Loop) {
	f.mu.Lock()
	f.l = l
	f.mu.Unlock()
}

func (f *loopFeed) Name() string                      { return f.loop().Name() }
func (f *loopFeed) Kind() string                      { return f.loop().Feed().Kind() }
func (f *loopFeed) Source() string                    { return f.loop().Feed().Source() }
func (f *loopFeed) Processor() string                 { return f.loop().Processor() }
func (f *loopFeed) State() (outbox.FeedState, string) { return f.loop().State() }
func (f *loopFeed) Ends() map[int32]int64             { return f.loop().Feed().Ends() }
func (f *loopFeed) Requeue(ctx context.Context, id int64, r outbox.Requeue) (bool, error) {
	return f.loop().RequeueWith(ctx, id, r)
}

// flaky wraps the ledger: a value listed in transient fails that many times
// with a transient error first; one listed in permanent, that many times
// with a permanent one.
type flaky struct {
	inner     ingest.Processor
	mu        sync.Mutex
	transient map[string]int
	permanent map[string]int
}

func (p *flaky) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	p.mu.Lock()
	v := string(item.Value)
	switch {
	case p.transient[v] > 0:
		p.transient[v]--
		p.mu.Unlock()
		return errors.New("flaky: try again")
	case p.permanent[v] > 0:
		p.permanent[v]--
		p.mu.Unlock()
		return ingest.Permanent("rejected", errors.New("rejected this time"))
	}
	p.mu.Unlock()
	return p.inner.Apply(ctx, tx, d, item)
}

// harness is a ledger feed on a file, run by a real ingest loop over a real
// store, behind an API server.
type harness struct {
	t     *testing.T
	store *outbox.Store
	path  string
	proc  *flaky
	feed  *loopFeed
	stop  func()
	srv   *api.Server
	ts    *httptest.Server
	// epoch1 is the file's first epoch, known once the first lines are in.
	epoch1 string
	// tune, when set, changes the loop's configuration.
	tune func(*ingest.Config)
}

const feedName = "ledger"

func newHarness(t *testing.T, cfg api.Config) *harness {
	t.Helper()
	return newTunedHarness(t, cfg, nil)
}

// newTunedHarness is newHarness whose loop's configuration tune changes.
func newTunedHarness(t *testing.T, cfg api.Config, tune func(*ingest.Config)) *harness {
	t.Helper()
	h := &harness{
		t: t, store: openStore(t), path: filepath.Join(t.TempDir(), "ledger.csv"),
		proc: &flaky{inner: ledger.New("ledger.out"), transient: map[string]int{}, permanent: map[string]int{}},
		feed: &loopFeed{}, tune: tune,
	}
	if err := os.WriteFile(h.path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.start(nil)
	t.Cleanup(func() { h.stop() })
	srv, err := api.New(withReader(cfg), h.store, []api.Feed{h.feed}, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	h.ts = httptest.NewServer(srv.Handler())
	t.Cleanup(h.ts.Close)
	return h
}

// start runs a new loop on the feed, opened at rewind when given.
func (h *harness) start(rewind map[int32]int64) {
	h.t.Helper()
	cfg := ingest.DefaultConfig(feedName)
	cfg.Processor = ledger.Name
	cfg.Retry = ingest.Retry{Attempts: 3, MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, AttemptTimeout: 5 * time.Second}
	cfg.CommitRetry = ingest.Retry{Attempts: 2, MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, AttemptTimeout: 5 * time.Second}
	cfg.OnCompletionFailure = ingest.OnCompletionSkip
	cfg.Logger = quiet()
	if h.tune != nil {
		h.tune(&cfg)
	}
	var feed ingest.Feed = filefeed.New(h.path, filefeed.Options{PollInterval: 20 * time.Millisecond, Logger: quiet()})
	if rewind != nil {
		feed = testseam.Rewound(feed, rewind)
	}
	l, err := ingest.NewLoop(h.store, feed, h.proc, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.feed.set(l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				h.t.Errorf("loop: %v", err)
			}
		})
	}
}

func (h *harness) append(s string) {
	h.t.Helper()
	f, err := os.OpenFile(h.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) stats() outbox.FeedStats {
	h.t.Helper()
	st, err := h.store.Feed(context.Background(), feedName)
	if err != nil && !errors.Is(err, outbox.ErrNotFound) {
		h.t.Fatal(err)
	}
	return st
}

func (h *harness) checkpoint() outbox.Checkpoint {
	h.t.Helper()
	cps, err := h.store.ReadPositions(context.Background(), feedName)
	if err != nil {
		h.t.Fatal(err)
	}
	if len(cps) == 0 {
		return outbox.Checkpoint{Position: -1}
	}
	return cps[0]
}

// waitPosition waits until the stored position is pos (in another epoch
// than not, when not is given) and the loop is in state.
func (h *harness) waitPosition(pos int64, not string, state outbox.FeedState) {
	h.t.Helper()
	wait(h.t, 10*time.Second, func() error {
		c := h.checkpoint()
		if c.Position != pos || (not != "" && c.Epoch == not) {
			return fmt.Errorf("position %s@%d, want %d (not in epoch %q)", c.Epoch, c.Position, pos, not)
		}
		if st, _ := h.feed.State(); st != state {
			return fmt.Errorf("at %d, state %s, want %s", pos, st, state)
		}
		return nil
	})
}

// injectedErr is the commit hook's error.
const injectedErr = "injected commit failure"

// script drives the feed through a fixed sequence and leaves it caught up:
//
//	"a,1" applied; "b,2" applied after one transient failure (a retry);
//	"junk" dead-lettered (malformed); "x,7" dead-lettered (rejected once,
//	so a requeue applies it); a restart rewound to 4 replays three items;
//	"c,3" is a completion failure, skipped (loss 17..21); "d,4" applied
//	while "e,5" waits unterminated; the file is truncated and "f,6"
//	written: a new epoch, and the loss of the unread 25..28.
func (h *harness) script() {
	h.t.Helper()
	h.proc.transient["b,2"] = 1
	h.proc.permanent["x,7"] = 1
	h.append("a,1\nb,2\njunk\nx,7\n")
	h.waitPosition(17, "", outbox.StateCaughtUp)
	h.epoch1 = h.checkpoint().Epoch

	h.stop()
	h.start(map[int32]int64{0: 4})
	wait(h.t, 10*time.Second, func() error {
		if n := h.stats().ReplaysSkipped; n != 3 {
			return fmt.Errorf("%d replays, want 3", n)
		}
		return nil
	})

	left := 2 // every try of the next batch (CommitRetry.Attempts); the skip commits
	var mu sync.Mutex
	h.store.SetCommitHook(func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if left > 0 {
			left--
			return errors.New(injectedErr)
		}
		return nil
	})
	h.append("c,3\n")
	h.waitPosition(21, "", outbox.StateCaughtUp)
	h.store.SetCommitHook(nil)

	h.append("d,4\ne,5")
	h.waitPosition(25, "", outbox.StateRunning) // "e,5" waits for its "\\n"
	wait(h.t, 10*time.Second, func() error {
		if end := h.feed.Ends()[0]; end != 28 {
			return fmt.Errorf("end %d, want 28", end)
		}
		return nil
	})
	if err := os.WriteFile(h.path, []byte("f,6\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
	h.waitPosition(4, h.epoch1, outbox.StateCaughtUp)
}

// wait is testutil.Wait.
var wait = testutil.Wait

// do sends a request to the harness's server and returns the status and
// the body. token, when not "", is sent as a bearer token.
func (h *harness) do(method, path, token string, body io.Reader) (int, http.Header, []byte) {
	h.t.Helper()
	return request(h.t, h.ts.URL, method, path, token, body)
}

func request(t *testing.T, base, method, path, token string, body io.Reader) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, b
}

// getJSON GETs path with the read token, wants 200, and decodes the body
// into v.
func (h *harness) getJSON(path string, v any) {
	h.t.Helper()
	code, _, b := h.do(http.MethodGet, path, readerToken, nil)
	if code != http.StatusOK {
		h.t.Fatalf("GET %s: %d %s", path, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		h.t.Fatalf("GET %s: %v in %s", path, err, b)
	}
}

// wantError checks an error answer: its status and stable code.
func wantError(t *testing.T, what string, code int, body []byte, wantCode int, errCode string) {
	t.Helper()
	if code != wantCode {
		t.Fatalf("%s: status %d, want %d (%s)", what, code, wantCode, body)
	}
	var e api.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("%s: body %q is not a JSON error: %v", what, body, err)
	}
	if e.Error.Code != errCode || e.Error.Message == "" {
		t.Fatalf("%s: error %+v, want code %s and a message", what, e.Error, errCode)
	}
	if strings.Contains(string(body), "goroutine ") {
		t.Fatalf("%s: a stack trace reached the client: %s", what, body)
	}
}

func jsonString(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newTestServer serves srv's handler and returns its URL.
func newTestServer(t *testing.T, srv *api.Server) string {
	t.Helper()
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

// fakeRelay is a relay whose status the test sets.
type fakeRelay struct {
	mu sync.Mutex
	s  api.RelayStatus
}

func (r *fakeRelay) set(s api.RelayStatus) {
	r.mu.Lock()
	r.s = s
	r.mu.Unlock()
}

func (r *fakeRelay) Status() api.RelayStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s
}
