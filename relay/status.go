package relay

import (
	"maps"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/relaystatus"
)

// States reported in Status.State.
const (
	// StateStarting: making a producer and reading the progress.
	StateStarting = "starting"
	// StatePublishing: a batch is being published.
	StatePublishing = "publishing"
	// StateIdle: everything in the outbox is published; waiting for rows.
	StateIdle = "idle"
	// StateBackingOff: the last attempt failed (LastError says how); the
	// relay waits before the next one.
	StateBackingOff = "backing-off"
	// StateUnauthorized: Kafka refused the relay's credentials or an
	// operation its ACLs do not grant; LastError names the operation and
	// the resource (or the credentials refused). The relay asks again
	// every Config.UnauthorizedBackoff and goes on once allowed.
	StateUnauthorized = "unauthorized"
	// StateRefusing: the database has gone back in time (LastError says
	// how); the relay publishes nothing.
	StateRefusing = "refusing"
	// StateFenced: another producer took over the transactional id; the
	// relay has stopped.
	StateFenced = "fenced"
	// StateStopped: Run has not started or has returned.
	StateStopped = "stopped"
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

func newTracker(mode string, now func() time.Time) *tracker {
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

func (t *tracker) state(state string) {
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
func (t *tracker) failed(state string, err error) {
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
