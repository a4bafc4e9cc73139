// Package sink relays the outbox to targets other than Kafka: a NATS
// JetStream stream, a PostgreSQL table, an HTTP endpoint (webhooks). Each
// target gives the strongest guarantee it can, stated on its own type:
//
//   - a target that can learn from itself what it holds (JetStream, a
//     PostgreSQL table with its progress row) is exactly-once: Resume tells
//     the runner where to go on after any crash, and Deliver never makes a
//     row durable twice;
//   - a target that cannot (an HTTP endpoint) is at-least-once with an
//     idempotency key per output, the outbox id: Resume returns 0 and the
//     runner goes on after the progress the store keeps for the sink.
//
// A sink is one named target and the output topics mapped to it. Several
// sinks may take the same topic; each keeps its own progress in the store,
// so one far behind never holds the others back.
package sink

import (
	"context"

	"github.com/outboxd/outboxd/outbox"
)

// Target is one system the outbox is relayed to. The runner calls its
// methods from one goroutine, never concurrently.
type Target interface {
	// Resume returns the largest outbox id the target durably holds for
	// this sink, learned from the target itself, or 0 when it holds none or
	// cannot tell. The runner resumes after the larger of it and the
	// store's progress for the sink. It is called before the first Deliver
	// and again after any Deliver that failed.
	Resume(ctx context.Context) (int64, error)

	// Deliver makes rows durable in the target. rows are in outbox id
	// order, every id above what Resume or the last successful Deliver
	// covered, and only of the topics mapped to the sink. A nil error
	// means every row is durable in the target except the ones returned:
	// those the target refused for good, each with its reason; the runner
	// stores them as dead letters before its progress passes them. An
	// error means any prefix of the rows may be durable: the runner calls
	// Resume and delivers again from there.
	Deliver(ctx context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error)

	// Close releases the target's connections.
	Close() error
}
