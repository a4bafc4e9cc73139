package webhook

import (
	"context"
	"sync"
	"time"
)

// breaker is a sink's circuit breaker: closed, it lets every request go;
// after failures consecutive failures it opens for openFor, letting none;
// then it lets one request probe (half-open): its success closes it, its
// failure opens it again.
type breaker struct {
	failures int
	openFor  time.Duration

	mu      sync.Mutex
	fails   int
	open    bool
	until   time.Time
	probing bool
	changed chan struct{} // closed and replaced on every change
}

func newBreaker(failures int, openFor time.Duration) *breaker {
	return &breaker{failures: failures, openFor: openFor, changed: make(chan struct{})}
}

// acquire waits until a request may go, or ctx is done; probe says the
// request is the half-open breaker's one probe.
func (b *breaker) acquire(ctx context.Context) (probe bool, err error) {
	for {
		b.mu.Lock()
		if !b.open {
			b.mu.Unlock()
			return false, nil
		}
		var wait <-chan time.Time
		if !b.probing {
			d := time.Until(b.until)
			if d <= 0 {
				b.probing = true
				b.mu.Unlock()
				return true, nil
			}
			wait = time.After(d)
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return false, context.Cause(ctx)
		case <-wait:
		case <-changed:
		}
	}
}

// done records the outcome of a request acquire let go (probe as acquire
// said). Any success closes the breaker: the endpoint answers. A failed
// probe opens it again; a request sent before it opened and failing after
// only counts.
func (b *breaker) done(probe, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	if ok {
		b.fails = 0
		b.open = false
	} else {
		b.fails++
		if probe || (!b.open && b.fails >= b.failures) {
			b.open = true
			b.until = time.Now().Add(b.openFor)
		}
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
