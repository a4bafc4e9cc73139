package ingest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// deadlineProc records how long each attempt had before its deadline, and
// blocks the value "slow" until its context ends.
type deadlineProc struct {
	mu    sync.Mutex
	left  map[string][]time.Duration
	ended map[string]int // attempts ended by their context
}

func (p *deadlineProc) Apply(ctx context.Context, tx *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
	dl, ok := ctx.Deadline()
	left := time.Until(dl)
	v := string(item.Value)
	p.mu.Lock()
	if !ok {
		left = -1
	}
	p.left[v] = append(p.left[v], left)
	p.mu.Unlock()
	if v == "slow" {
		<-ctx.Done()
		p.mu.Lock()
		p.ended[v]++
		p.mu.Unlock()
		return ctx.Err()
	}
	return tx.Emit(ctx, outbox.Output{Topic: "out", Value: item.Value})
}

// Every attempt is bounded by the attempt timeout, less at most the time
// the loop shares one context between attempts; an attempt the timeout
// ended leaves the next item a fresh context.
func TestLoop_AttemptTimeout(t *testing.T) {
	const timeout = 320 * time.Millisecond
	const reuse = timeout / 64 // 5ms: what attempts may share
	s := outboxtest.TempStore(t)
	f := newMemFeed("e", "a", "slow", "b")
	p := &deadlineProc{left: map[string][]time.Duration{}, ended: map[string]int{}}
	cfg := testConfig()
	cfg.Retry.AttemptTimeout = timeout
	_, stop := running(t, s, f, p, cfg)
	wait(t, 10*time.Second, positionIs(s, "f", "e", 3))
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	equal(t, "attempts of slow", len(p.left["slow"]), 3)
	equal(t, "attempts of slow ended by their deadline", p.ended["slow"], 3)
	for v, lefts := range p.left {
		for i, left := range lefts {
			// 100ms of slack for scheduling on a busy machine: a context
			// reused past its bound would have next to nothing left.
			if left > timeout || left < timeout-reuse-100*time.Millisecond {
				t.Errorf("attempt %d of %q had %v before its deadline, want within %v of %v", i+1, v, left, reuse, timeout)
			}
		}
	}
	equal(t, "attempts of b", len(p.left["b"]), 1)
	st := stats(t, s)
	equal(t, "applied", st.Applied, int64(2))
	equal(t, "dead-lettered", st.DeadLettered, int64(1))
	equal(t, "retries", st.Retries, int64(2))
	rows := outboxRows(t, s)
	equal(t, "outbox rows", len(rows), 3) // a, the dead letter of slow, b
	equal(t, "last row", rows[2], rowPlace{"out", "e", 3, 0, "b"})
}
