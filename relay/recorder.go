package relay

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// recorder stores exactly-once progress in SQLite off the publishing path:
// Kafka already holds it (the progress record committed with the rows), so
// the next transaction need not wait for an fsync. Writes coalesce: only
// the latest id is written, at most once every recordGap. SQLite's progress
// may therefore lag Kafka's by a few transactions, which a restart settles
// by reading Kafka's.
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

// recordGap is the least time between two writes of the progress. Each is
// a transaction of its own, with its fsync, holding SQLite's one writer
// while the ingest loop waits for it: written after every Kafka
// transaction, they cost the server a sixth of its end-to-end rate
// (forwarded short lines, synchronous=full).
const recordGap = 100 * time.Millisecond

// run writes until ctx is done (after the last transaction), then makes a
// last write bounded by final.
func (rc *recorder) run(ctx, final context.Context) {
	gap := time.NewTimer(0)
	defer gap.Stop()
	for {
		select {
		case <-rc.wake:
		case <-ctx.Done():
			rc.flush(final)
			return
		}
		select { // no sooner than recordGap after the last write
		case <-gap.C:
		case <-ctx.Done():
			rc.flush(final)
			return
		}
		rc.flush(ctx)
		gap.Reset(recordGap)
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
