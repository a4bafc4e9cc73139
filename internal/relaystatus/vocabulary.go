package relaystatus

// State is what the relay is doing (Status.State): the relay sets it, the
// API, its metrics and `outboxd status` report it.
type State string

// The relay's states, and the one the API reports with no relay.
const (
	// StateStarting: making a producer and reading the progress.
	StateStarting State = "starting"
	// StatePublishing: a batch is being published.
	StatePublishing State = "publishing"
	// StateIdle: everything in the outbox is published; waiting for rows.
	StateIdle State = "idle"
	// StateBackingOff: the last attempt failed (LastError says how); the
	// relay waits before the next one.
	StateBackingOff State = "backing-off"
	// StateUnauthorized: Kafka refused the relay's credentials or an
	// operation its ACLs do not grant; LastError names the operation and
	// the resource (or the credentials refused). The relay asks again
	// every relay.Config.UnauthorizedBackoff and goes on once allowed;
	// /readyz fails meanwhile.
	StateUnauthorized State = "unauthorized"
	// StateRefusing: the database has gone back in time (LastError says
	// how); the relay publishes nothing.
	StateRefusing State = "refusing"
	// StateFenced: another producer took over the transactional id; the
	// relay has stopped.
	StateFenced State = "fenced"
	// StateStopped: the relay's Run has not started or has returned.
	StateStopped State = "stopped"
	// StateOff: no relay runs (relay mode none); the API's word, never the
	// relay's.
	StateOff State = "off"
)

// States lists every state the API may report, StateOff last: the order of
// the metrics' outboxd_relay_state series.
var States = []State{StateStarting, StatePublishing, StateIdle, StateBackingOff,
	StateUnauthorized, StateRefusing, StateFenced, StateStopped, StateOff}

// Mode is how the relay publishes (Status.Mode, relay.Config.Mode).
type Mode string

// The relay's modes, and the one the API reports with no relay.
const (
	// ModeExactlyOnce: each batch in a Kafka transaction with the relay's
	// progress.
	ModeExactlyOnce Mode = "exactly-once"
	// ModeAtLeastOnce: an idempotent producer, rows marked published
	// after the ack.
	ModeAtLeastOnce Mode = "at-least-once"
	// ModeNone: no relay runs; the API's word, never the relay's.
	ModeNone Mode = "none"
)

// StateIs reports whether the status is in state st.
func (s Status) StateIs(st State) bool { return s.State == st }
