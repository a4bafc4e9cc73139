package relay

import (
	"maps"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/relaystatus"
)

// State is what the relay is doing (Status.State): the shared
// vocabulary of internal/relaystatus, which the API reports.
type State = relaystatus.State

// The states the relay reports in Status.State; relaystatus documents each.
const (
	StateStarting     = relaystatus.StateStarting
	StatePublishing   = relaystatus.StatePublishing
	StateIdle         = relaystatus.StateIdle
	StateBackingOff   = relaystatus.StateBackingOff
	StateUnauthorized = relaystatus.StateUnauthorized
	StateRefusing     = relaystatus.StateRefusing
	StateFenced       = relaystatus.StateFenced
	StateStopped      = relaystatus.StateStopped
)

// Status is a snapshot of the relay, for the API and tests.
type Status = relaystatus.Status

// errorClasses are the classes Status.Errors counts.
var errorClasses = []Class{Retryable, Ambiguous, Fenced, Fatal}

// tracker holds the live status. It is safe for concurrent use.
type tracker struct {
	mu       sync.Mutex
	s        Status
	oldestAt int64 // unix nanoseconds of the oldest pending row, 0 = none
	now      func() time.Time
}

func newTracker(mode Mode, now func() time.Time) *tracker {
	errs := make(map[string]int64, len(errorClasses))
	for _, c := range errorClasses {
		errs[c.String()] = 0
	}
	return &tracker{s: Status{Mode: mode, State: StateStopped, Errors: errs}, now: now}
}

func (t *tracker) snapshot() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	s.Errors = maps.Clone(t.s.Errors)
	if t.oldestAt > 0 && s.Pending > 0 {
		s.OldestPendingAge = max(t.now().Sub(time.Unix(0, t.oldestAt)), 0)
	}
	return s
}

func (t *tracker) update(f func(s *Status)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(&t.s)
}

func (t *tracker) state(state State) {
	t.update(func(s *Status) { s.State = state })
}

// starting records a session starting; an unauthorized relay stays so
// until the session is allowed to publish.
func (t *tracker) starting() {
	t.update(func(s *Status) {
		if s.State != StateUnauthorized {
			s.State = StateStarting
		}
	})
}

func (t *tracker) lastPublished() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.s.LastPublishedID
}

// failed records err and the state it leaves the relay in.
func (t *tracker) failed(state State, err error) {
	t.update(func(s *Status) {
		s.State, s.Connected = state, false
		s.LastError, s.LastErrorAt = err.Error(), t.now()
		s.Errors[Classify(err).String()]++
	})
}

// resending records a failure the producer retries within its
// transaction (a leader or coordinator moving, a broker away): the last
// error says so until a batch is published, and when no broker answered
// the relay is not connected meanwhile. It is not counted in Errors: the
// session goes on.
func (t *tracker) resending(err error, unanswered bool) {
	t.update(func(s *Status) {
		s.LastError, s.LastErrorAt = "sending again: "+err.Error(), t.now()
		if unanswered {
			s.Connected = false
		}
	})
}

// published records a committed (or acked) batch of n rows ending at last.
func (t *tracker) published(last int64, n int) {
	t.update(func(s *Status) {
		s.State, s.Connected, s.LastError, s.LastErrorAt = StatePublishing, true, "", time.Time{}
		s.LastPublishedID = max(s.LastPublishedID, last)
		s.PublishedTotal += int64(n)
		s.Transactions++
	})
}

// backlog records a fresh count of the rows after the last published one.
func (t *tracker) backlog(pending, oldestAt int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.Pending, t.oldestAt = pending, oldestAt
}
