package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/sink/webhook"
)

const hookSecret = "whsec-test"

// hookRequest is one request the receiver got.
type hookRequest struct {
	id     int64
	key    string
	body   string
	status int // 0 while being answered
}

// hookReceiver is an endpoint on 127.0.0.1 that fails (500, 503, 429),
// times out and answers slowly at random, and records every request with
// the outputs of each key its 200s have answered so far.
type hookReceiver struct {
	t   *testing.T
	srv *httptest.Server

	mu   sync.Mutex
	rnd  *rand.Rand
	reqs []hookRequest
	ok   map[int64]bool     // answered 200
	seen map[string][]int64 // key -> ids in order of first arrival
	bad  []string
}

func newHookReceiver(t *testing.T, seed uint64) *hookReceiver {
	h := &hookReceiver{t: t, rnd: rand.New(rand.NewPCG(seed, 3)), ok: map[int64]bool{}, seen: map[string][]int64{}}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookReceiver) fail(format string, args ...any) {
	h.bad = append(h.bad, fmt.Sprintf(format, args...))
}

func (h *hookReceiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	id, idErr := strconv.ParseInt(r.Header.Get(webhook.HeaderIdempotencyKey), 10, 64)
	key := r.Header.Get(webhook.HeaderKey)
	sigErr := webhook.Verify(hookSecret, r.Header.Get(webhook.HeaderSignature), body, time.Now(), 5*time.Minute)
	h.mu.Lock()
	if idErr != nil {
		h.fail("Idempotency-Key %q: %v", r.Header.Get(webhook.HeaderIdempotencyKey), idErr)
	}
	if sigErr != nil {
		h.fail("request %d: %v", id, sigErr)
	}
	if r.URL.Path != "/in/ledger" {
		h.fail("request %d to %s, want /in/ledger", id, r.URL.Path)
	}
	// A key's output comes only after every earlier output of the key
	// that arrived was answered 200: its order is kept.
	ids := h.seen[key]
	first := true
	for _, prev := range ids {
		if prev == id {
			first = false
		}
		if prev < id && !h.ok[prev] {
			h.fail("output %d of key %s arrived before output %d of the key was answered 200", id, key, prev)
		}
		if prev > id && first {
			h.fail("output %d of key %s first arrived after output %d", id, key, prev)
		}
	}
	if first {
		h.seen[key] = append(ids, id)
	}
	i := len(h.reqs)
	h.reqs = append(h.reqs, hookRequest{id: id, key: key, body: string(body)})
	roll := h.rnd.IntN(100)
	h.mu.Unlock()

	status := 200
	switch {
	case roll < 8:
		status = 500
	case roll < 10:
		w.Header().Set("Retry-After", "0")
		status = 503
	case roll < 12:
		status = 429
	case roll < 14:
		time.Sleep(1500 * time.Millisecond) // beyond the sink's timeout
		status = -1
	case roll < 30:
		time.Sleep(time.Duration(roll-14) * time.Millisecond)
	}
	h.mu.Lock()
	h.reqs[i].status = status
	if status == 200 {
		h.ok[id] = true
	}
	h.mu.Unlock()
	if status > 0 {
		w.WriteHeader(status)
	}
}

// TestSinkWebhook_KillNine: 20,000 lines, 10 kill -9s; every output of
// ledger.out is answered 200 at least once with its Idempotency-Key, the
// same body on every repeat, and no key's order is broken.
func TestSinkWebhook_KillNine(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 30))
	lf := makeLedger(rng, 20_000)
	want := ledgerOutputsByPos(t, lf)
	h := newHookReceiver(t, seed)
	yaml := fmt.Sprintf(`sinks:
  - name: hook
    url: %s/in
    secret: %s
    topics:
      ledger.out: {path: ledger}
    options: {timeout: 1s, min_backoff: 5ms, max_backoff: 100ms, breaker_open: 200ms, concurrency: "8"}
`, h.srv.URL, hookSecret)
	delivered := func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.ok)
	}
	sinkKillRun(t, rng, lf, 10, yaml, func() error {
		if n := delivered(); n < len(want) {
			return fmt.Errorf("%d outputs answered 200, want %d", n, len(want))
		}
		return nil
	})

	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range h.bad {
		t.Error(b)
	}
	if t.Failed() {
		t.FailNow()
	}
	bodyOf := map[int64]string{}
	posOf := map[int64]int64{}
	byPos := map[int64]int64{}
	repeats := 0
	for _, r := range h.reqs {
		if b, ok := bodyOf[r.id]; ok {
			if b != r.body {
				t.Fatalf("output %d sent with two bodies: %q and %q", r.id, b, r.body)
			}
			repeats++
			continue
		}
		bodyOf[r.id] = r.body
		var o ledger.Output
		if err := json.Unmarshal([]byte(r.body), &o); err != nil {
			t.Fatalf("output %d: body %q: %v", r.id, r.body, err)
		}
		o.Epoch = ""
		if w, ok := want[o.Position]; !ok || w != o || r.key != o.Account {
			t.Fatalf("output %d: %+v keyed %q, want %+v", r.id, o, r.key, w)
		}
		if other, dup := byPos[o.Position]; dup {
			t.Fatalf("position %d sent as outputs %d and %d: two idempotency keys for one output", o.Position, other, r.id)
		}
		byPos[o.Position], posOf[r.id] = r.id, o.Position
	}
	if len(bodyOf) != len(want) || len(h.ok) != len(want) {
		t.Fatalf("%d outputs sent, %d answered 200, want %d", len(bodyOf), len(h.ok), len(want))
	}
	for id := range bodyOf {
		if !h.ok[id] {
			t.Fatalf("output %d (position %d) never answered 200", id, posOf[id])
		}
	}
	// Per key, outbox ids and positions grow together.
	for key, ids := range h.seen {
		for i := 1; i < len(ids); i++ {
			if posOf[ids[i]] <= posOf[ids[i-1]] {
				t.Fatalf("key %s: output %d at position %d after output %d at %d", key, ids[i], posOf[ids[i]], ids[i-1], posOf[ids[i-1]])
			}
		}
	}
	t.Logf("%d requests for %d outputs (%d repeats of an output)", len(h.reqs), len(want), repeats)
}
