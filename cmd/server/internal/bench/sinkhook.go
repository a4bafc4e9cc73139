package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/outboxd/outboxd/sink/webhook"
)

// The webhook sink's shape (with --webhook): sink_webhook drains the
// ingest phase's outbox to an endpoint in the bench process on 127.0.0.1
// that verifies each signature and answers 200, timed from its first
// request until every outbox id has been answered; then it checks each id
// came with one body. The endpoint's CPU is the bench's, not in CPU/item.

const hookBenchSecret = "outboxd-bench"

// hookEndpoint records the outbox ids it answered.
type hookEndpoint struct {
	srv *http.Server
	ln  net.Listener

	mu      sync.Mutex
	got     bitset
	n       int64
	repeats int64
	bad     int64
	first   time.Time
	lastErr string
}

func startHookEndpoint(lines int64) (*hookEndpoint, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("webhook endpoint: %w", err)
	}
	h := &hookEndpoint{ln: ln, got: newBitset(lines + 1)}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go h.srv.Serve(ln)
	return h, nil
}

func (h *hookEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	id, idErr := strconv.ParseInt(r.Header.Get(webhook.HeaderIdempotencyKey), 10, 64)
	if err == nil && idErr == nil {
		err = webhook.Verify(hookBenchSecret, r.Header.Get(webhook.HeaderSignature), body, time.Now(), 5*time.Minute)
	} else if err == nil {
		err = idErr
	}
	h.mu.Lock()
	if h.first.IsZero() {
		h.first = time.Now()
	}
	switch {
	case err != nil || id < 1 || id >= int64(len(h.got))*64:
		h.bad++
		h.lastErr = fmt.Sprintf("request %q: %v", r.Header.Get(webhook.HeaderIdempotencyKey), err)
	case h.got.set(id):
		h.repeats++
	default:
		h.n++
	}
	h.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// state is how many outputs the endpoint answered, each once, and when
// its first request came.
func (h *hookEndpoint) state() (n int64, first time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n, h.first
}

func (h *hookEndpoint) close() { h.srv.Close() }

func (b *bench) runSinkWebhook(ctx context.Context) error {
	const phase = "sink_webhook"
	h, err := startHookEndpoint(b.data.Lines)
	if err != nil {
		return err
	}
	defer h.close()
	cfg := b.path(phase + ".yaml")
	yaml := fmt.Sprintf(`sinks:
  - name: %s
    url: http://%s/in
    secret: %s
`, phase, h.ln.Addr(), hookBenchSecret)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return fmt.Errorf("write the sink's configuration: %w", err)
	}
	res, err := b.timeBacklog(ctx, phase, engineSpec{db: b.backlog, source: "file:" + b.data.Path, topic: b.topic("relay"), relay: "none",
		extra: []string{"--config", cfg}}, "the webhook sink to deliver output %d",
		func(*engineRun) (int64, time.Time, error) {
			n, first := h.state()
			return n, first, nil
		})
	if err != nil {
		return err
	}
	b.res.SinkWebhook = res
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bad > 0 {
		b.res.Verify.fail("%s: %d requests without a good idempotency key or signature, the last: %s", phase, h.bad, h.lastErr)
	}
	if h.n != b.data.Lines {
		b.res.Verify.fail("%s: %d outputs answered, want %d", phase, h.n, b.data.Lines)
	}
	return nil
}
