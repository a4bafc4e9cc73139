package sink

import (
	"sync"
	"time"
)

// The states of a sink (Status.State).
const (
	StateStarting   = "starting"    // resuming: asking the target what it holds
	StateIdle       = "idle"        // every row is delivered; waiting for more
	StateDelivering = "delivering"  // delivering rows
	StateBackingOff = "backing-off" // the last attempt failed; trying again after a wait
	StateRefusing   = "refusing"    // the target holds ids the database never had: an operator must look
	StateStopped    = "stopped"     // not running
)

// Status is a snapshot of a sink.
type Status struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"` // the URL scheme
	URL   string `json:"url"`  // without a password
	State string `json:"state"`
	// Topics are the output topics the sink takes (empty: every topic).
	Topics []string `json:"topics"`
	// Delivered is the last outbox id the sink holds or passed over;
	// Stored the last one stored as its progress (pruning goes by it).
	Delivered int64 `json:"deliveredId"`
	Stored    int64 `json:"storedId"`
	// LagRows and LagBytes are the outbox rows after Delivered and about
	// what they take in the database.
	LagRows  int64 `json:"lagRows"`
	LagBytes int64 `json:"lagBytes"`
	// DeliveredTotal counts the rows delivered since the start,
	// DeadLettered the rows the target refused for good, Errors the
	// failed attempts, since the start.
	DeliveredTotal int64 `json:"deliveredTotal"`
	DeadLettered   int64 `json:"deadLettered"`
	Errors         int64 `json:"errors"`
	// Missed counts the rows pruned before the sink read them: of a sink
	// added (or added again) after they went.
	Missed int64 `json:"missed"`
	// LastError is the last failure, cleared by the next delivery.
	LastError   string    `json:"lastError"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// LastDeliveryAt is when rows were last delivered.
	LastDeliveryAt time.Time `json:"lastDeliveryAt,omitzero"`
}

// tracker holds a Status for concurrent readers.
type tracker struct {
	mu sync.Mutex
	s  Status
}

func (t *tracker) snapshot() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	s.Topics = append([]string{}, s.Topics...) // [] for every topic, never null
	return s
}

func (t *tracker) update(f func(*Status)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(&t.s)
}

func (t *tracker) state(state string) { t.update(func(s *Status) { s.State = state }) }

func (t *tracker) failed(state string, err error, at time.Time) {
	t.update(func(s *Status) {
		s.State, s.LastError, s.LastErrorAt = state, err.Error(), at
		s.Errors++
	})
}
