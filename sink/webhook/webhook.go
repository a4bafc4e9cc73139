// Package webhook relays the outbox to an HTTP endpoint: one POST per
// output, at least once.
//
// An endpoint cannot say what it already received, so Resume returns 0 and
// the runner goes on after the progress the store keeps for the sink; a
// crash repeats at most the outputs after that progress. Every request
// carries the output's outbox id as its Idempotency-Key (the same on every
// attempt and every repeat): a receiver that stores the key in the same
// transaction as the request's effect, and skips a key it holds, applies
// each output exactly once.
//
// Each body is signed as Stripe signs its webhooks: the header
// Outboxd-Signature is "t=TIMESTAMP,v1=HEX", HEX the HMAC-SHA256 with the
// sink's secret of TIMESTAMP + "." + body, TIMESTAMP the Unix seconds of
// the attempt (also in Outboxd-Timestamp). Verify computes it back.
//
// A 2xx response delivers the output. A 4xx other than 408 and 429 refuses
// it for good: it is dead-lettered with the status and the start of the
// response body. Anything else (5xx, 408, 429, a 3xx, a timeout, a refused
// connection) is tried again with capped exponential backoff and full
// jitter, after the response's Retry-After when it says (bounded). A
// breaker shared by the sink's requests opens after consecutive failures:
// while open nothing is sent; then one request probes, and its success
// closes it.
//
// Outputs of one key are sent in outbox id order, each only after the one
// before it succeeded or was dead-lettered; outputs of different keys go
// concurrently, up to Concurrency requests at a time. Outputs without a
// key are one key.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox"
)

// Request headers.
const (
	HeaderIdempotencyKey = "Idempotency-Key"    // the outbox id, decimal
	HeaderSignature      = "Outboxd-Signature"  // t=TIMESTAMP,v1=HEX
	HeaderTimestamp      = "Outboxd-Timestamp"  // Unix seconds, as signed
	HeaderTopic          = "Outboxd-Topic"      // the output's topic
	HeaderKey            = "Outboxd-Key"        // the key, when printable ASCII
	HeaderKeyBase64      = "Outboxd-Key-Base64" // else the key in standard base64
	HeaderFeed           = "Outboxd-Feed"       // the feed of the item that made it
	HeaderPartition      = "Outboxd-Partition"  // its partition
	HeaderEpoch          = "Outboxd-Epoch"      // its epoch
	HeaderPosition       = "Outboxd-Position"   // its position
)

// ReasonRejected is the dead letter reason of an output the endpoint
// refused with a 4xx other than 408 and 429.
const ReasonRejected = "webhook-rejected"

// Config is one webhook sink.
type Config struct {
	// URL is the endpoint (http:// or https://).
	URL string
	// Paths maps output topics to paths joined to URL; other topics go to
	// URL itself.
	Paths map[string]string
	// Sink names the sink (in logs and the User-Agent).
	Sink string
	// Secret signs the bodies; required.
	Secret string
	// Concurrency bounds the requests in flight (default 8).
	Concurrency int
	// Timeout bounds each request, response body included (default 10s).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before an attempt again
	// (defaults 100ms and 30s); MaxRetryAfter bounds a Retry-After
	// (default 60s).
	MinBackoff, MaxBackoff, MaxRetryAfter time.Duration
	// Attempts bounds the attempts of one output in one Deliver (default
	// 10): then Deliver fails, and the runner delivers again from its
	// progress.
	Attempts int
	// BreakerFailures consecutive failures open the breaker (default 5),
	// for BreakerOpen (default 30s) before a probe.
	BreakerFailures int
	BreakerOpen     time.Duration
	// MaxErrorBody bounds the bytes of a response body kept in a dead
	// letter (default 4096).
	MaxErrorBody int
	// Client sends the requests (default: a client of its own, with no
	// redirects followed).
	Client *http.Client
	// Logger logs (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock of the signatures (default time.Now).
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.MaxRetryAfter <= 0 {
		c.MaxRetryAfter = 60 * time.Second
	}
	if c.Attempts <= 0 {
		c.Attempts = 10
	}
	if c.BreakerFailures <= 0 {
		c.BreakerFailures = 5
	}
	if c.BreakerOpen <= 0 {
		c.BreakerOpen = 30 * time.Second
	}
	if c.MaxErrorBody <= 0 {
		c.MaxErrorBody = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Check reports a mistake in c without connecting.
func (c Config) Check() error {
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("webhook: URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("webhook: URL %q: want http://HOST/... or https://HOST/...", u.Redacted())
	}
	if c.Secret == "" {
		return errors.New("webhook: no secret: every body is signed with the sink's secret")
	}
	for topic, p := range c.Paths {
		if _, err := url.Parse(p); err != nil {
			return fmt.Errorf("webhook: path of topic %s: %w", topic, err)
		}
	}
	return nil
}

// Target is a webhook sink; it implements sink.Target.
type Target struct {
	cfg    Config
	client *http.Client
	base   *url.URL
	urls   map[string]string // topic -> endpoint
	br     *breaker
}

// Open makes the target; it connects with its first request.
func Open(cfg Config) (*Target, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	base, _ := url.Parse(cfg.URL)
	t := &Target{cfg: cfg, base: base, urls: map[string]string{}}
	for topic, p := range cfg.Paths {
		t.urls[topic] = base.JoinPath(p).String()
	}
	t.client = cfg.Client
	if t.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.Concurrency
		t.client = &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	t.br = newBreaker(cfg.BreakerFailures, cfg.BreakerOpen)
	return t, nil
}

// Resume returns 0: an endpoint cannot tell what it received.
func (t *Target) Resume(context.Context) (int64, error) { return 0, nil }

// Close releases idle connections.
func (t *Target) Close() error {
	t.client.CloseIdleConnections()
	return nil
}

// BreakerOpen reports whether the breaker is open or probing.
func (t *Target) BreakerOpen() bool { return t.br.isOpen() }

// Deliver posts every row, each key's rows in order, and returns those the
// endpoint refused. An error (a row that kept failing for Attempts, or
// ctx done) means any of the rows may have been received.
func (t *Target) Deliver(ctx context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	// The rows of each key, in order of first appearance.
	idx := map[string]int{}
	var lanes [][]outbox.Row
	for _, r := range rows {
		i, ok := idx[string(r.Key)]
		if !ok {
			i = len(lanes)
			idx[string(r.Key)] = i
			lanes = append(lanes, nil)
		}
		lanes[i] = append(lanes[i], r)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan []outbox.Row)
	var (
		mu   sync.Mutex
		dead []outbox.RowDeadLetter
		wg   sync.WaitGroup
	)
	for range min(t.cfg.Concurrency, len(lanes)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lane := range next {
				for _, r := range lane {
					d, err := t.post(ctx, r)
					if err != nil {
						cancel(err)
						return
					}
					if d != nil {
						mu.Lock()
						dead = append(dead, *d)
						mu.Unlock()
					}
				}
			}
		}()
	}
feed:
	for _, lane := range lanes {
		select {
		case next <- lane:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	sortByID(dead)
	return dead, nil
}

func sortByID(dls []outbox.RowDeadLetter) {
	for i := 1; i < len(dls); i++ {
		for j := i; j > 0 && dls[j].Row.ID < dls[j-1].Row.ID; j-- {
			dls[j], dls[j-1] = dls[j-1], dls[j]
		}
	}
}

// post sends r until it is delivered (nil, nil), refused (its dead
// letter) or out of attempts (an error).
func (t *Target) post(ctx context.Context, r outbox.Row) (*outbox.RowDeadLetter, error) {
	var last error
	for attempt := 1; ; attempt++ {
		probe, err := t.br.acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("webhook: output %d: %w (last failure: %v)", r.ID, err, last)
		}
		status, body, retryAfter, err := t.send(ctx, r)
		switch {
		case err == nil && status/100 == 2:
			t.br.done(probe, true)
			return nil, nil
		case err == nil && status/100 == 4 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests:
			t.br.done(probe, true) // the endpoint answers: not its failure
			return &outbox.RowDeadLetter{Row: r, Reason: ReasonRejected,
				Error: fmt.Sprintf("HTTP %d: %s", status, body)}, nil
		}
		t.br.done(probe, false)
		if err == nil {
			err = fmt.Errorf("HTTP %d: %s", status, body)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("webhook: output %d: %w (last failure: %v)", r.ID, context.Cause(ctx), err)
		}
		last = err
		if attempt >= t.cfg.Attempts {
			return nil, fmt.Errorf("webhook: output %d: %d attempts failed, the last: %w", r.ID, attempt, err)
		}
		wait := t.backoff(attempt)
		if retryAfter > 0 {
			wait = min(retryAfter, t.cfg.MaxRetryAfter)
		}
		t.cfg.Logger.Debug("webhook attempt failed; trying again", "sink", t.cfg.Sink, "outbox_id", r.ID, "attempt", attempt, "err", err, "retry_in", wait)
		if err := clock.Sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("webhook: output %d: %w (last failure: %v)", r.ID, context.Cause(ctx), last)
		}
	}
}

// backoff is the wait after the attempt-th failure: a random duration up
// to MinBackoff doubled attempt-1 times, capped at MaxBackoff.
func (t *Target) backoff(attempt int) time.Duration {
	d := t.cfg.MinBackoff
	for i := 1; i < attempt && d < t.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, t.cfg.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}

// send makes one attempt: the response's status, the start of its body
// (for a status that is not 2xx) and its Retry-After, or an error.
func (t *Target) send(ctx context.Context, r outbox.Row) (int, string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	endpoint, ok := t.urls[r.Topic]
	if !ok {
		endpoint = t.cfg.URL
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(r.Value))
	if err != nil {
		return 0, "", 0, err
	}
	req.ContentLength = int64(len(r.Value))
	t.headers(req.Header, r)
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		// The endpoint answered 2xx: delivered. Drain a bounded part of
		// the body so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return resp.StatusCode, "", 0, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, int64(t.cfg.MaxErrorBody)))
	return resp.StatusCode, string(b), retryAfter(resp.Header.Get("Retry-After"), t.cfg.Now()), nil
}

// headers sets the headers of r's request.
func (t *Target) headers(h http.Header, r outbox.Row) {
	ts := strconv.FormatInt(t.cfg.Now().Unix(), 10)
	h.Set("User-Agent", "outboxd-webhook/"+t.cfg.Sink)
	if json.Valid(r.Value) {
		h.Set("Content-Type", "application/json")
	} else {
		h.Set("Content-Type", "application/octet-stream")
	}
	h.Set(HeaderIdempotencyKey, strconv.FormatInt(r.ID, 10))
	h.Set(HeaderTimestamp, ts)
	h.Set(HeaderSignature, "t="+ts+",v1="+Sign(t.cfg.Secret, ts, r.Value))
	h.Set(HeaderTopic, headerSafe(r.Topic))
	if len(r.Key) > 0 {
		if printable(r.Key) {
			h.Set(HeaderKey, string(r.Key))
		} else {
			h.Set(HeaderKeyBase64, base64.StdEncoding.EncodeToString(r.Key))
		}
	}
	h.Set(HeaderFeed, headerSafe(r.Feed))
	h.Set(HeaderPartition, strconv.Itoa(int(r.Partition)))
	h.Set(HeaderEpoch, headerSafe(r.Epoch))
	h.Set(HeaderPosition, strconv.FormatInt(r.Position, 10))
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// headerSafe is s when it is printable ASCII, else s with every other byte
// as %XX (names and epochs are such in practice).
func headerSafe(s string) string {
	if printable([]byte(s)) {
		return s
	}
	var b strings.Builder
	for _, c := range []byte(s) {
		if c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// retryAfter parses a Retry-After header: seconds or an HTTP date; 0 when
// absent or not understood.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}

// Sign is the hex HMAC-SHA256 with secret of timestamp + "." + body.
func Sign(secret, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks a request's Outboxd-Signature header against its body with
// secret, and that its timestamp is within tolerance of now (0: any), as
// a receiver should before it acts on a request.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	if ts == "" || len(sigs) == 0 {
		return errors.New("webhook signature: want t=TIMESTAMP,v1=HEX")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("webhook signature: timestamp %q: %w", ts, err)
	}
	if tolerance > 0 {
		if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
			return fmt.Errorf("webhook signature: timestamp %s is %v from now, beyond %v", ts, d.Round(time.Second), tolerance)
		}
	}
	want, _ := hex.DecodeString(Sign(secret, ts, body))
	for _, s := range sigs {
		got, err := hex.DecodeString(s)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("webhook signature: no v1 signature matches the body")
}
