package webhook_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/webhook"
)

var _ sink.Target = (*webhook.Target)(nil)

const secret = "s3cret"

func row(id int64, keys int) outbox.Row {
	return outbox.Row{ID: id, Feed: "f", Partition: 2, Epoch: "e1", Position: id * 10, Topic: "orders",
		Key: []byte(fmt.Sprintf("k%d", id%int64(keys))), Value: []byte(fmt.Sprintf(`{"id":%d}`, id))}
}

func rows(from, to int64, keys int) []outbox.Row {
	var out []outbox.Row
	for id := from; id <= to; id++ {
		out = append(out, row(id, keys))
	}
	return out
}

// request is one request the receiver got.
type request struct {
	id     int64 // Idempotency-Key
	key    string
	body   []byte
	header http.Header
	at     time.Time
	status int
}

// receiver records every request; answer decides each response.
type receiver struct {
	t         *testing.T
	srv       *httptest.Server
	answer    func(r request, w http.ResponseWriter) int
	tolerance time.Duration

	mu   sync.Mutex
	reqs []request
}

func newReceiver(t *testing.T, answer func(r request, w http.ResponseWriter) int) *receiver {
	return newReceiverTolerance(t, 5*time.Minute, answer)
}

// newReceiverTolerance is newReceiver checking signed timestamps within
// tolerance of now (0: not at all).
func newReceiverTolerance(t *testing.T, tolerance time.Duration, answer func(r request, w http.ResponseWriter) int) *receiver {
	rc := &receiver{t: t, answer: answer, tolerance: tolerance}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	id, err := strconv.ParseInt(req.Header.Get(webhook.HeaderIdempotencyKey), 10, 64)
	if err != nil {
		rc.t.Errorf("Idempotency-Key %q: %v", req.Header.Get(webhook.HeaderIdempotencyKey), err)
	}
	if err := webhook.Verify(secret, req.Header.Get(webhook.HeaderSignature), body, time.Now(), rc.tolerance); err != nil {
		rc.t.Errorf("request %d: %v", id, err)
	}
	if ts := req.Header.Get(webhook.HeaderTimestamp); !strings.HasPrefix(req.Header.Get(webhook.HeaderSignature), "t="+ts+",v1=") {
		rc.t.Errorf("request %d: timestamp header %q is not the signed one in %q", id, ts, req.Header.Get(webhook.HeaderSignature))
	}
	r := request{id: id, key: req.Header.Get(webhook.HeaderKey), body: body, header: req.Header.Clone(), at: time.Now()}
	rc.mu.Lock()
	i := len(rc.reqs)
	rc.reqs = append(rc.reqs, r)
	rc.mu.Unlock()
	st := rc.answer(r, w)
	rc.mu.Lock()
	rc.reqs[i].status = st
	rc.mu.Unlock()
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.reqs...)
}

func open(t *testing.T, cfg webhook.Config) *webhook.Target {
	t.Helper()
	cfg.Secret, cfg.Sink = secret, "hook"
	tg, err := webhook.Open(cfg)
	testutil.Must(t, err)
	t.Cleanup(func() { tg.Close() })
	return tg
}

func TestDeliver_ChaosReceiver(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var rmu sync.Mutex
	rnd := rand.New(rand.NewPCG(seed, 1))
	roll := func() int {
		rmu.Lock()
		defer rmu.Unlock()
		return rnd.IntN(100)
	}
	rc := newReceiver(t, func(r request, w http.ResponseWriter) int {
		if r.id == 77 {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, "bad order 77: missing field x")
			return 400
		}
		switch n := roll(); {
		case n < 15:
			w.WriteHeader(http.StatusInternalServerError)
			return 500
		case n < 20:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return 503
		case n < 25:
			w.WriteHeader(http.StatusTooManyRequests)
			return 429
		case n < 28:
			w.WriteHeader(http.StatusRequestTimeout)
			return 408
		case n < 33:
			time.Sleep(400 * time.Millisecond) // beyond the client's timeout
			return -1
		case n < 55:
			time.Sleep(time.Duration(n-33) * time.Millisecond)
		}
		w.WriteHeader(http.StatusOK)
		return 200
	})
	tg := open(t, webhook.Config{URL: rc.srv.URL, Concurrency: 4, Timeout: 200 * time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, Attempts: 1000,
		BreakerFailures: 1000, BreakerOpen: 10 * time.Millisecond})
	all := rows(1, 300, 20)
	var dead []outbox.RowDeadLetter
	for _, b := range [][2]int{{0, 100}, {100, 101}, {101, 300}} {
		dls, err := tg.Deliver(context.Background(), all[b[0]:b[1]])
		testutil.Must(t, err)
		dead = append(dead, dls...)
	}
	if len(dead) != 1 || dead[0].Row.ID != 77 || dead[0].Reason != webhook.ReasonRejected ||
		dead[0].Error != "HTTP 400: bad order 77: missing field x" {
		t.Fatalf("dead letters %+v, want output 77 with the 400 and its body", dead)
	}
	reqs := requests(t, rc)
	delivered := map[int64]bool{}
	lastOfKey := map[string]int64{}
	byID := map[int64]outbox.Row{}
	for _, r := range all {
		byID[r.ID] = r
	}
	for i, r := range reqs {
		want, ok := byID[r.id]
		if !ok {
			t.Fatalf("request %d: Idempotency-Key %d is no output", i, r.id)
		}
		if !bytes.Equal(r.body, want.Value) || r.key != string(want.Key) {
			t.Fatalf("request %d (output %d): body %q key %q, want %q %q", i, r.id, r.body, r.key, want.Value, want.Key)
		}
		if r.id < lastOfKey[r.key] {
			t.Fatalf("request %d: output %d of key %s arrived after output %d of that key", i, r.id, r.key, lastOfKey[r.key])
		}
		lastOfKey[r.key] = r.id
		if r.status == 200 {
			delivered[r.id] = true
		}
	}
	for _, r := range all {
		if !delivered[r.ID] && r.ID != 77 {
			t.Fatalf("output %d never answered 200", r.ID)
		}
	}
	t.Logf("%d requests for %d outputs", len(reqs), len(all))
	if len(reqs) <= len(all) {
		t.Fatalf("%d requests for %d outputs: the receiver failed none", len(reqs), len(all))
	}
}

// requests waits for the receiver's handlers still running (a request
// the client gave up on) and returns what it got.
func requests(t *testing.T, rc *receiver) []request {
	t.Helper()
	var reqs []request
	testutil.Wait(t, 10*time.Second, func() error {
		reqs = rc.requests()
		for _, r := range reqs {
			if r.status == 0 {
				return fmt.Errorf("request %d still being answered", r.id)
			}
		}
		return nil
	})
	return reqs
}

func TestDeliver_RejectedBodyIsBounded(t *testing.T) {
	big := strings.Repeat("x", 10000)
	rc := newReceiver(t, func(r request, w http.ResponseWriter) int {
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, big)
		return 422
	})
	tg := open(t, webhook.Config{URL: rc.srv.URL, MaxErrorBody: 100})
	dls, err := tg.Deliver(context.Background(), rows(1, 2, 1))
	testutil.Must(t, err)
	if len(dls) != 2 || dls[0].Row.ID != 1 || dls[1].Row.ID != 2 || dls[0].Error != "HTTP 422: "+big[:100] {
		t.Fatalf("dead letters %+v", dls)
	}
	testutil.Equal(t, "requests", len(requests(t, rc)), 2)
}

func TestDeliver_AttemptsThenError(t *testing.T) {
	rc := newReceiver(t, func(r request, w http.ResponseWriter) int {
		w.WriteHeader(http.StatusBadGateway)
		return 502
	})
	tg := open(t, webhook.Config{URL: rc.srv.URL, Attempts: 3, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	_, err := tg.Deliver(context.Background(), rows(1, 1, 1))
	if err == nil || !strings.Contains(err.Error(), "3 attempts failed, the last: HTTP 502") {
		t.Fatalf("Deliver: %v, want 3 attempts failed", err)
	}
	testutil.Equal(t, "requests", len(requests(t, rc)), 3)
	id, err := tg.Resume(context.Background())
	testutil.Must(t, err)
	testutil.Equal(t, "Resume", id, int64(0))
}

func TestBreaker_OpensAndProbes(t *testing.T) {
	var mu sync.Mutex
	n := 0
	rc := newReceiver(t, func(r request, w http.ResponseWriter) int {
		mu.Lock()
		n++
		fail := n <= 6
		mu.Unlock()
		if fail {
			w.WriteHeader(http.StatusInternalServerError)
			return 500
		}
		return 200
	})
	const open = 300 * time.Millisecond
	tg := newTarget(t, webhook.Config{URL: rc.srv.URL, Concurrency: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
		BreakerFailures: 3, BreakerOpen: open, Attempts: 100})
	dls, err := tg.Deliver(context.Background(), rows(1, 2, 1))
	testutil.Must(t, err)
	testutil.Equal(t, "dead letters", len(dls), 0)
	reqs := requests(t, rc)
	testutil.Equal(t, "requests", len(reqs), 8) // 6 failures, then outputs 1 and 2
	// Failures 1-3 close together; after the third the breaker is open:
	// each of the probes 4, 5, 6 (failing) and 7 comes after a full open
	// period.
	for i := 3; i <= 6; i++ {
		if gap := reqs[i].at.Sub(reqs[i-1].at); gap < open {
			t.Fatalf("request %d came %v after request %d, the breaker is open for %v", i+1, gap, i, open)
		}
	}
	if tg.BreakerOpen() {
		t.Fatal("breaker open after a success")
	}
}

func newTarget(t *testing.T, cfg webhook.Config) *webhook.Target { return open(t, cfg) }

func TestRetryAfter_HonouredAndBounded(t *testing.T) {
	var mu sync.Mutex
	n := 0
	rc := newReceiver(t, func(r request, w http.ResponseWriter) int {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		switch k {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return 429
		case 3:
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusServiceUnavailable)
			return 503
		}
		return 200
	})
	tg := open(t, webhook.Config{URL: rc.srv.URL, Concurrency: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
		MaxRetryAfter: 1500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := tg.Deliver(ctx, rows(1, 2, 1))
	testutil.Must(t, err)
	reqs := requests(t, rc)
	testutil.Equal(t, "requests", len(reqs), 4)
	if gap := reqs[1].at.Sub(reqs[0].at); gap < time.Second {
		t.Fatalf("retry %v after a Retry-After of 1s", gap)
	}
	if gap := reqs[3].at.Sub(reqs[2].at); gap < 1500*time.Millisecond {
		t.Fatalf("retry %v after a Retry-After of an hour bounded to 1.5s", gap)
	}
}

func TestHeaders(t *testing.T) {
	rc := newReceiverTolerance(t, 0, func(r request, w http.ResponseWriter) int { return 200 })
	now := time.Unix(1800000000, 0)
	tg, err := webhook.Open(webhook.Config{URL: rc.srv.URL + "/base", Paths: map[string]string{"bin": "/raw"}, Secret: secret, Sink: "hook", Now: func() time.Time { return now }})
	testutil.Must(t, err)
	defer tg.Close()
	a := row(5, 1000)
	b := outbox.Row{ID: 6, Feed: "f2", Partition: 1, Epoch: "ino:42", Position: 99, Topic: "bin", Key: []byte{0, 1, 0xff}, Value: []byte{0xde, 0xad}}
	_, err = tg.Deliver(context.Background(), []outbox.Row{a, b})
	testutil.Must(t, err)
	reqs := requests(t, rc)
	testutil.Equal(t, "requests", len(reqs), 2)
	if reqs[0].id != 5 {
		reqs[0], reqs[1] = reqs[1], reqs[0]
	}
	for _, c := range []struct {
		h      http.Header
		name   string
		want   string
		reqURL string
	}{
		{reqs[0].header, "Content-Type", "application/json", ""},
		{reqs[0].header, webhook.HeaderTopic, "orders", ""},
		{reqs[0].header, webhook.HeaderKey, "k5", ""},
		{reqs[0].header, webhook.HeaderFeed, "f", ""},
		{reqs[0].header, webhook.HeaderPartition, "2", ""},
		{reqs[0].header, webhook.HeaderEpoch, "e1", ""},
		{reqs[0].header, webhook.HeaderPosition, "50", ""},
		{reqs[0].header, webhook.HeaderTimestamp, "1800000000", ""},
		{reqs[0].header, webhook.HeaderSignature, "t=1800000000,v1=" + webhook.Sign(secret, "1800000000", a.Value), ""},
		{reqs[1].header, "Content-Type", "application/octet-stream", ""},
		{reqs[1].header, webhook.HeaderKey, "", ""},
		{reqs[1].header, webhook.HeaderKeyBase64, base64.StdEncoding.EncodeToString(b.Key), ""},
		{reqs[1].header, webhook.HeaderEpoch, "ino:42", ""},
		{reqs[1].header, webhook.HeaderPosition, "99", ""},
	} {
		testutil.Equal(t, c.name, c.h.Get(c.name), c.want)
	}
	// The tampered body or a stale timestamp does not verify.
	sig := reqs[0].header.Get(webhook.HeaderSignature)
	testutil.Must(t, webhook.Verify(secret, sig, a.Value, now.Add(time.Minute), 5*time.Minute))
	if err := webhook.Verify(secret, sig, []byte(`{"id":6}`), now, 0); err == nil {
		t.Fatal("a tampered body verifies")
	}
	if err := webhook.Verify("other", sig, a.Value, now, 0); err == nil {
		t.Fatal("another secret verifies")
	}
	if err := webhook.Verify(secret, sig, a.Value, now.Add(time.Hour), 5*time.Minute); err == nil {
		t.Fatal("a timestamp an hour old verifies")
	}
}

func TestHeaders_Paths(t *testing.T) {
	var mu sync.Mutex
	paths := map[int64]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.Header.Get(webhook.HeaderIdempotencyKey), 10, 64)
		mu.Lock()
		paths[id] = r.URL.Path
		mu.Unlock()
	}))
	defer srv.Close()
	tg, err := webhook.Open(webhook.Config{URL: srv.URL + "/base", Paths: map[string]string{"bin": "raw/in"}, Secret: secret})
	testutil.Must(t, err)
	defer tg.Close()
	a, b := row(1, 1), row(2, 1)
	b.Topic = "bin"
	_, err = tg.Deliver(context.Background(), []outbox.Row{a, b})
	testutil.Must(t, err)
	mu.Lock()
	defer mu.Unlock()
	testutil.Equal(t, "path of topic orders", paths[1], "/base")
	testutil.Equal(t, "path of topic bin", paths[2], "/base/raw/in")
}

func TestConfig_Check(t *testing.T) {
	for _, c := range []struct {
		cfg webhook.Config
		err string
	}{
		{webhook.Config{URL: "ftp://x/", Secret: "s"}, "want http://HOST"},
		{webhook.Config{URL: "http:///nohost", Secret: "s"}, "want http://HOST"},
		{webhook.Config{URL: "https://x/"}, "no secret"},
	} {
		if err := c.cfg.Check(); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Check(%+v) = %v, want %q", c.cfg, err, c.err)
		}
	}
	testutil.Must(t, webhook.Config{URL: "https://x/", Secret: "s"}.Check())
}

func TestConfigFrom(t *testing.T) {
	c, err := webhook.ConfigFrom("h", "https://x/in", "s", map[string]string{"a": "/a", "b": ""},
		map[string]string{"concurrency": "3", "timeout": "2s", "attempts": "4", "breaker_open": "1m", "max_error_body": "10"})
	testutil.Must(t, err)
	if c.Concurrency != 3 || c.Timeout != 2*time.Second || c.Attempts != 4 || c.BreakerOpen != time.Minute ||
		c.MaxErrorBody != 10 || len(c.Paths) != 1 || c.Paths["a"] != "/a" || c.Secret != "s" || c.Sink != "h" {
		t.Fatalf("ConfigFrom: %+v", c)
	}
	for opts, want := range map[string]string{
		"colour=red":    `option "colour": a webhook sink reads concurrency, timeout`,
		"timeout=-1s":   `option timeout: "-1s": want a positive duration`,
		"concurrency=0": `option concurrency: "0": want a number from 1 to 1024`,
	} {
		k, v, _ := strings.Cut(opts, "=")
		if _, err := webhook.ConfigFrom("h", "https://x/", "s", nil, map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ConfigFrom(%s) = %v, want %q", opts, err, want)
		}
	}
	if _, err := webhook.ConfigFrom("h", "https://x/", "", nil, nil); err == nil || !strings.Contains(err.Error(), "no secret") {
		t.Errorf("ConfigFrom without a secret: %v", err)
	}
}
