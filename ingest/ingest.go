// Package ingest reads feeds and applies their items to processors, exactly
// once, through the outbox store.
//
// A Feed yields positioned records; the Loop hands each item to a Processor
// inside a store transaction (one per batch, a SAVEPOINT per item) and writes
// the feed's (epoch, position) in the same transaction. Only after COMMIT
// does the feed commit its own pointer. The stored position is the authority:
// an item at or before it, in the same epoch, is skipped as a replay.
//
// A transaction the store fails is handled by the error's class (see
// outbox.Classify): retried, cut in pieces to find the record to blame, or
// stalled on until the cause is gone; a feed that cannot go on says so in
// its state (outbox.StateFailed) and Run's error.
package ingest

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxd/outboxd/outbox"
)

// Delivery is how an item reached the processor.
type Delivery struct {
	// Feed is the feed's name.
	Feed string
	// Partition is the feed's partition (0 for a file). For a Kafka feed's
	// main topic it is the topic's partition; the partitions of its extra
	// topics (a retry topic) are numbered apart, so positions never mix.
	Partition int32
	// Topic is the Kafka topic the item was read from ("" for a file).
	Topic string
	// Sequence counts this run's deliveries from 1. It restarts with every
	// run: never compare it across a restart.
	Sequence int64
	// Epoch names the source's position space: a file's identity, a Kafka
	// topic's id with the partition. Positions of different epochs are not
	// comparable.
	Epoch string
	// Position is the source's position after the item: the byte offset
	// after a file's line, the offset after a Kafka record.
	Position int64
	// Attempt is 1 for the first try and grows with each retry of the item.
	Attempt int
}

// AlreadyApplied reports whether the item is covered by a stored checkpoint:
// true only for the same, known epoch and a position at or before the stored
// one. It is false when either side is unknown (an empty epoch or a negative
// position) and for a different epoch, so a replaced source never has new
// items skipped by mistake.
func (d Delivery) AlreadyApplied(epoch string, position int64) bool {
	if d.Epoch == "" || epoch == "" || d.Position < 0 || position < 0 {
		return false
	}
	return d.Epoch == epoch && d.Position <= position
}

// Place is the item's place, as the outbox records it.
func (d Delivery) Place() outbox.Place {
	return outbox.Place{Feed: d.Feed, Partition: d.Partition, Epoch: d.Epoch, Position: d.Position}
}

// Item is what a processor is given: a line of a file (Value, no Key) or a
// Kafka record.
type Item struct {
	Key     []byte
	Value   []byte
	Headers []outbox.Header
}

// Processor applies items to state kept in the store.
//
// Apply runs inside the batch's transaction, in the item's own SAVEPOINT: it
// reads and writes its state through tx and emits its outputs with tx.Emit.
// If it returns an error every write it made is rolled back. An error
// wrapped by Permanent (bad input) dead-letters the item at once; any other
// error is transient and the item is retried. Apply is called from one
// goroutine per feed; it must not keep tx after returning.
type Processor interface {
	Apply(ctx context.Context, tx *outbox.Tx, d Delivery, item Item) error
}

// ProcessorFunc adapts a function to Processor.
type ProcessorFunc func(ctx context.Context, tx *outbox.Tx, d Delivery, item Item) error

// Apply calls f.
func (f ProcessorFunc) Apply(ctx context.Context, tx *outbox.Tx, d Delivery, item Item) error {
	return f(ctx, tx, d, item)
}

// Reasons a dead letter carries.
const (
	ReasonMalformed    = "malformed"     // the input is not what the processor reads
	ReasonTooLong      = "line-too-long" // a file line over the feed's limit
	ReasonRetriesSpent = "retries-exhausted"
	// ReasonOutputTooLarge: an output of the item that Kafka does not take;
	// the relay stores it (the output, not the item) as a dead letter.
	ReasonOutputTooLarge = outbox.ReasonOutputTooLarge
	// ReasonConstraint: the item's writes broke a rule of the schema (a
	// unique key, a foreign key, a CHECK), as they would on every retry.
	ReasonConstraint = "constraint"
)

// PermanentError is a processor error that retrying cannot fix.
type PermanentError struct {
	Reason string // short, stable, machine-readable: "malformed", "unknown-type"
	Err    error
	// Attempts, when not 0, is how many times the processor itself tried
	// the item (rounds through a retry topic, each coming back as a new
	// delivery): the dead letter counts those rather than the loop's tries
	// of this delivery.
	Attempts int
}

func (e *PermanentError) Error() string { return e.Reason + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent with a reason; the item is dead-lettered
// at once.
func Permanent(reason string, err error) error {
	return &PermanentError{Reason: reason, Err: err}
}

// PermanentAfter is Permanent for an item the processor tried attempts
// times in all.
func PermanentAfter(reason string, attempts int, err error) error {
	return &PermanentError{Reason: reason, Err: err, Attempts: attempts}
}

// Malformed is Permanent(ReasonMalformed, fmt.Errorf(format, args...)).
func Malformed(format string, args ...any) error {
	return Permanent(ReasonMalformed, fmt.Errorf(format, args...))
}

// IsPermanent returns the permanent error in err's chain, if any.
func IsPermanent(err error) (*PermanentError, bool) {
	var p *PermanentError
	ok := errors.As(err, &p)
	return p, ok
}
