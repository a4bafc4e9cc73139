package outbox

// FeedState is where a feed stands, as the ingest loop reports it and the
// API shows it. The vocabulary lives here, beside what is stored about a
// feed, because both the loop (ingest) and the API use it and neither may
// import the other; outbox is the one package both already import.
type FeedState string

// The feed states.
const (
	// StateRunning: items are being applied, or wait to be (lag above 0).
	StateRunning FeedState = "running"
	// StateCaughtUp: every partition's stored position is at or past the
	// source's end, as last seen.
	StateCaughtUp FeedState = "caught-up"
	// StateWaiting: the feed runs but its source is absent (a file not yet
	// created); the feed's last error says what it waits for.
	StateWaiting FeedState = "waiting"
	// StateBackpressure: the outbox backlog is past its bound (the relay
	// cannot publish, Kafka is away): the feed reads nothing more and
	// applies nothing until the relay has drained the backlog below the
	// bound; the last error says how far past it is. Nothing is lost:
	// the feed resumes where it stopped.
	StateBackpressure FeedState = "backpressure"
	// StateStalled: the feed cannot move (its commits keep failing, or an
	// item keeps failing under the stop policy). It retries by itself with
	// a capped backoff and resumes once the cause is gone; the last error
	// says why.
	StateStalled FeedState = "stalled"
	// StateFailed: the feed stopped for good (it could not start, the
	// database is corrupt, another process claimed it): nothing more is
	// applied until the process is restarted; the last error says why.
	StateFailed FeedState = "failed"
	// StateStopped: the feed is not running (shut down, or known only from
	// the database).
	StateStopped FeedState = "stopped"
)

// FeedStates lists every state, in the order the metrics report them.
var FeedStates = []FeedState{StateRunning, StateCaughtUp, StateWaiting, StateBackpressure, StateStalled, StateFailed, StateStopped}

// Moving reports whether s is one of the states of a feed that applies
// items as they come (running or caught-up): which of the two it is
// depends only on the positions and the source's ends.
func (s FeedState) Moving() bool { return s == StateRunning || s == StateCaughtUp }

// Healthy reports whether a feed in state s needs no operator: every state
// but stalled and failed.
func (s FeedState) Healthy() bool { return s != StateStalled && s != StateFailed }

// CaughtUpOrRunning is StateCaughtUp when every position is at or past its
// partition's end, and StateRunning otherwise; positions and ends must come
// from the same reading, so the state and the lag agree.
func CaughtUpOrRunning(positions, ends map[int32]int64) FeedState {
	for p, end := range ends {
		if positions[p] < end {
			return StateRunning
		}
	}
	return StateCaughtUp
}
