package ingest

import (
	"sync"

	"github.com/outboxd/outboxd/outbox"
)

// loopStatus is what Loop.State reports. The loop's goroutine writes it;
// the API reads it from its own.
type loopStatus struct {
	mu sync.Mutex
	// phase is StateRunning while the feed moves (State tells caught-up
	// from running by the positions), or StateBackpressure, StateStalled,
	// StateFailed or StateStopped.
	phase     outbox.FeedState
	lastError string
	positions map[int32]int64 // the committed positions, by partition
	// open is set once the feed's Open returned: until then its ends say
	// nothing of the source, so the feed is not caught up.
	open bool
}

func (s *loopStatus) get() (phase outbox.FeedState, lastError string, positions map[int32]int64, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase, s.lastError, s.positions, s.open
}

func (s *loopStatus) set(phase outbox.FeedState, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = phase
	s.lastError = message(err)
}

// move: the feed applies what comes (or, before opened, is being opened).
func (s *loopStatus) move() { s.set(outbox.StateRunning, nil) }

// opened: the feed's Open returned, so its ends are the source's.
func (s *loopStatus) opened() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open = true
}

// stall: the feed cannot move for cause, and retries.
func (s *loopStatus) stall(cause error) { s.set(outbox.StateStalled, cause) }

// backpressure: the feed waits for the outbox backlog to shrink, as why
// says.
func (s *loopStatus) backpressure(why error) { s.set(outbox.StateBackpressure, why) }

// fail: the feed stopped for good, for err.
func (s *loopStatus) fail(err error) { s.set(outbox.StateFailed, err) }

// stop: the feed shut down; its last error stays.
func (s *loopStatus) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = outbox.StateStopped
}

// setError sets the last error without changing the phase (nil clears it).
func (s *loopStatus) setError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastError = message(err)
}

// committed records the positions a commit stored.
func (s *loopStatus) committed(cps map[int32]outbox.Checkpoint) {
	pos := make(map[int32]int64, len(cps))
	for p, c := range cps {
		pos[p] = c.Position
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.positions = pos
}

func message(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
