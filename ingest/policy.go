package ingest

import (
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// FailurePolicy says what becomes of an item whose transient errors
// outlast its retries (Config.OnFailure, a feed's --on-failure).
type FailurePolicy string

// Failure policies.
const (
	OnFailureDeadLetter FailurePolicy = "dead-letter" // store it as a dead letter, go on
	OnFailureStop       FailurePolicy = "stop"        // stall the feed
)

// CompletionPolicy says what becomes of a batch whose COMMIT keeps failing
// (Config.OnCompletionFailure, a feed's --on-completion-failure).
type CompletionPolicy string

// Completion failure policies.
const (
	OnCompletionStop CompletionPolicy = "stop" // stall the feed: nothing moves
	OnCompletionSkip CompletionPolicy = "skip" // move past the batch without its effects, record the loss
)

// Retry is an exponential backoff schedule with a bounded number of attempts.
type Retry struct {
	// Attempts is the total number of tries, the first included (>= 1).
	Attempts int
	// MinDelay is the wait before the second try; each wait doubles up to MaxDelay.
	MinDelay, MaxDelay time.Duration
	// AttemptTimeout bounds each try (0: no bound).
	AttemptTimeout time.Duration
}

// DefaultRetry is 5 attempts, waiting 100ms to 2s between them, 2s per attempt.
func DefaultRetry() Retry {
	return Retry{Attempts: 5, MinDelay: 100 * time.Millisecond, MaxDelay: 2 * time.Second, AttemptTimeout: 2 * time.Second}
}

// Validate reports an unusable schedule.
func (r Retry) Validate() error {
	if r.Attempts < 1 {
		return fmt.Errorf("attempts: %d, want at least 1", r.Attempts)
	}
	if r.MinDelay < 0 || r.MaxDelay < r.MinDelay {
		return fmt.Errorf("delays: %v..%v, want 0 <= min <= max", r.MinDelay, r.MaxDelay)
	}
	if r.AttemptTimeout < 0 {
		return fmt.Errorf("attempt timeout: %v is negative", r.AttemptTimeout)
	}
	return nil
}

// backoff returns a fresh schedule of waits between attempts, with jitter so
// that feeds failing together do not retry in lockstep.
func (r Retry) backoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = r.MinDelay
	b.MaxInterval = r.MaxDelay
	b.Multiplier = 2
	b.RandomizationFactor = 0.2
	b.Reset()
	return b
}
