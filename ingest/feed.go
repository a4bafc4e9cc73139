package ingest

import (
	"context"

	"github.com/outboxd/outboxd/outbox"
)

// Feed kinds, as the status reports them.
const (
	KindFile  = "file"
	KindKafka = "kafka"
)

// RecordKind tells what a Record carries.
type RecordKind uint8

const (
	// RecordItem is an item for the processor.
	RecordItem RecordKind = iota
	// RecordEpoch says the partition's source now has a new epoch, starting
	// at Position. The loop stores it (and commits) before any item after it.
	RecordEpoch
	// RecordLoss says input vanished before it was read: positions From..To
	// of epoch Epoch, for Reason. The loop records the loss (the feed stops
	// being lossless) before any item after it.
	RecordLoss
)

// Record is what a feed yields: an item, an epoch change or a loss.
type Record struct {
	Kind      RecordKind
	Partition int32
	// Topic is the Kafka topic an item was read from ("" for a file).
	Topic string
	// Epoch is the item's epoch, the new epoch, or the epoch of the lost range.
	Epoch string
	// Position is the position after the item, or where a new epoch starts.
	Position int64
	Item     Item

	// BadReason, set on an item the feed could not read whole (a line over
	// the limit, an unreadable record), dead-letters it with BadErr without
	// calling the processor.
	BadReason string
	BadErr    error

	// From, To and Reason describe a loss. To is UnknownPosition when
	// the loss's extent cannot be known (the bytes a file held past From
	// before it was truncated, with no copy of them left).
	From, To int64
	Reason   string

	// Replayed is set only by a replay's feed: the item's recorded
	// delivery, which the loop uses (see Replayed).
	Replayed *Replayed
}

// UnknownPosition, as a loss's To, says its extent is unknown: input from
// From on vanished, and nothing tells how much of it there was.
const UnknownPosition int64 = -1

// Feed is a source of positioned records.
//
// A feed guarantees: records of one partition come in position order; every
// item carries the position after it; a change of epoch is announced with a
// RecordEpoch before the new epoch's items, and vanished input with a
// RecordLoss. A feed never drops an item silently: what it cannot read whole
// it yields with BadReason set.
//
// Poll and Commit are called from one goroutine; Ends may be called from any.
type Feed interface {
	// Kind is KindFile or KindKafka; Source names what is read (a path, a topic).
	Kind() string
	Source() string
	// Open positions the feed right after the given checkpoints (keyed by
	// partition; empty for a new feed). Where the source's epoch is not the
	// stored one, the feed starts with the RecordLoss and RecordEpoch that
	// explain it.
	Open(ctx context.Context, from map[int32]outbox.Checkpoint) error
	// Poll appends up to max ready records to buf and returns it. It blocks
	// until at least one record is ready, or returns ctx.Err() when ctx is
	// done first. Called with ctx done already, it should still append the
	// records ready at once (the loop asks so whether a batch can grow
	// without waiting); one that returns ctx.Err() with none only closes
	// batches sooner.
	Poll(ctx context.Context, buf []Record, max int) ([]Record, error)
	// Commit tells the source that everything up to these checkpoints is
	// durably applied, so it may forget it (a Kafka group offset). It is
	// called only after the store's commit.
	Commit(ctx context.Context, through []outbox.Checkpoint) error
	// Ends returns the source's end per partition as last seen: a file's
	// size, a partition's high watermark.
	Ends() map[int32]int64
	// Close releases the feed's resources. It must be safe without Open
	// and after a failed Open: the loop closes every feed it ran, whatever
	// happened.
	Close() error
}

// Waiter is implemented by feeds whose source can be absent (a file not yet
// created). Waiting returns why the feed is waiting for its source, or ""
// when the source is there. It is safe for concurrent use. While it says
// why and nothing else is wrong, the loop reports the feed as
// outbox.StateWaiting with that reason as its last error.
type Waiter interface {
	Waiting() string
}

// Troubler is implemented by feeds whose source can refuse them while the
// loop waits in Poll: a Kafka cluster that refuses the feed's credentials,
// or an operation its ACLs do not grant. Trouble returns the refusal
// ("" for none), naming what an operator must fix; stalls says it keeps
// the feed from reading (the loop reports StateStalled with it as the
// last error), as opposed to a refusal beside reading (a group's offsets:
// the state stays, the refusal is the last error). Safe for concurrent
// use.
type Troubler interface {
	Trouble() (msg string, stalls bool)
}
