package relay

import (
	"context"
	"time"
)

// stopping is how a Run is asked to stop, in two steps, and the one value
// passed to what publishes, records and closes producers (see "Stopping" in
// the package doc):
//
//   - soft is Run's context. Once it is done no new session, batch or
//     transaction begins, and what waits for rows or backs off returns.
//   - hard is done Config.ShutdownTimeout after soft. It bounds the work
//     in hand: the transaction (or the acks) of the batch being
//     published, its progress write, the last write of the recorder, and
//     the wait for a closing producer. Work on it may still finish once
//     soft is done; past hard it is abandoned.
//
// What only begins work takes soft (a context), what finishes it takes
// hard; a function that does both takes the stopping value.
type stopping struct {
	soft, hard context.Context
}

// newStopping returns the stopping value of a Run on ctx, whose hard step
// comes grace after ctx is done, and the function that releases it.
func newStopping(ctx context.Context, grace time.Duration) (stopping, context.CancelFunc) {
	hard, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return stopping{soft: ctx, hard: hard}, func() {
		stop()
		cancel()
	}
}

// asked reports whether the Run has been asked to stop (soft is done).
func (s stopping) asked() bool { return s.soft.Err() != nil }
