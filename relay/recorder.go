package relay

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/outboxd/outboxd/outbox"
)

// recorder stores exactly-once progress in SQLite off the publishing path:
// Kafka already holds it (the progress record committed with the rows), so
// the next transaction need not wait for an fsync. Writes coalesce: only
// the latest id is written. SQLite's progress may therefore lag Kafka's by
// a few transactions, which a restart settles by reading Kafka's.
type recorder struct {
	store   *outbox.Store
	relayID string
	log     *slog.Logger
	// recorded is the last id stored in SQLite: pruning never goes past it.
	recorded *atomic.Int64
	// written is called after each successful write.
	written func()

	latest atomic.Int64
	wake   chan struct{}
}

func newRecorder(store *outbox.Store, relayID string, recorded *atomic.Int64, log *slog.Logger, written func()) *recorder {
	return &recorder{store: store, relayID: relayID, recorded: recorded, log: log, written: written,
		wake: make(chan struct{}, 1)}
}

// record asks for id to be stored; it never blocks.
func (rc *recorder) record(id int64) {
	for {
		cur := rc.latest.Load()
		if id <= cur || rc.latest.CompareAndSwap(cur, id) {
			break
		}
	}
	select {
	case rc.wake <- struct{}{}:
	default:
	}
}

// run writes until ctx is done (after the last transaction), then makes a
// last write bounded by final.
func (rc *recorder) run(ctx, final context.Context) {
	for {
		select {
		case <-rc.wake:
			if ctx.Err() == nil {
				rc.flush(ctx)
				continue
			}
			rc.flush(final)
			return
		case <-ctx.Done():
			rc.flush(final)
			return
		}
	}
}

func (rc *recorder) flush(ctx context.Context) {
	id := rc.latest.Load()
	if id <= rc.recorded.Load() {
		return
	}
	if err := rc.store.SetRelayProgress(ctx, rc.relayID, id); err != nil {
		if ctx.Err() != nil {
			return // stopping: the last write follows
		}
		rc.log.Warn("storing progress in SQLite failed; Kafka holds it", "last_id", id, "err", err)
		return
	}
	rc.recorded.Store(id)
	rc.written()
}
