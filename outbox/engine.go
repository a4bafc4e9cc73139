package outbox

import (
	"context"
	"time"
)

// Writer is the store's writing half, what an engine implements to take
// the ingest loop's and the relay's writes: transactions (Begin, and Tx's
// flush of the outputs in chunks), ownership, the feeds' registration and
// bookkeeping, the relay's progress and pruning, and the dead letters'
// resolution. Store is the SQLite engine's.
type Writer interface {
	Begin(ctx context.Context) (*Tx, error)
	SetCommitHook(h func(ctx context.Context) error)
	Committed() <-chan struct{}
	Claim(ctx context.Context) (int64, error)
	Claimed() bool
	CheckOwner(ctx context.Context) error
	CheckWritable(ctx context.Context) error
	RegisterFeed(ctx context.Context, f FeedInfo) error
	RecordProcessor(ctx context.Context, f FeedInfo, id ProcessorID, how string) error
	SetLastError(ctx context.Context, feed, msg string) error
	AckLosses(ctx context.Context, feed string) (int64, error)
	AckLossesBy(ctx context.Context, feed string, a LossAck) (int64, error)
	DiscardDeadLetter(ctx context.Context, feed string, id int64, d Discard) (bool, error)
	DiscardDeadLetters(ctx context.Context, feed, reason string, d Discard) (int64, error)
	SetRelayProgress(ctx context.Context, relayID string, lastID int64) error
	Prune(ctx context.Context, through int64, cutoff time.Time) (int64, error)
	Checkpoint(ctx context.Context) (CheckpointResult, error)
	Close() error
}

// Reader is the store's reading half, what an engine implements to serve
// the status pages and the relay's reads (the state queries stand apart,
// see PrepareQuery): outbox rows, backlogs, positions, feeds, losses and
// dead letters. Store is the SQLite engine's.
type Reader interface {
	Rows(ctx context.Context, after int64, limit int) ([]Row, error)
	RelayRows(ctx context.Context, after int64, limit int) ([]Row, error)
	RecentRows(after int64, limit int) []Row
	LastOutboxID(ctx context.Context) (int64, error)
	RelayProgress(ctx context.Context, relayID string) (int64, error)
	MaxRelayProgress(ctx context.Context) (int64, error)
	PublishedThrough(ctx context.Context) (int64, error)
	Backlog(ctx context.Context, feed string, after int64) (Backlog, error)
	PendingBacklog(ctx context.Context) (Pending, error)
	FeedStatus(ctx context.Context, name string, published int64) (FeedSnapshot, error)
	FeedStatuses(ctx context.Context, published int64) ([]FeedSnapshot, error)
	OutboxStatus(ctx context.Context, published int64) (OutboxSnapshot, error)
	Positions(ctx context.Context, feed string) (map[int32]Checkpoint, error)
	ReadPositions(ctx context.Context, feed string) ([]Checkpoint, error)
	Feed(ctx context.Context, name string) (FeedStats, error)
	Feeds(ctx context.Context) ([]FeedStats, error)
	FeedProcessor(ctx context.Context, feed string) (FeedProcessor, error)
	Losses(ctx context.Context, feed string) ([]Loss, error)
	DeadLetters(ctx context.Context, feed string, after int64, limit int) ([]DeadLetter, error)
	DeadLetterByID(ctx context.Context, feed string, id int64) (DeadLetter, error)
	DeadLetterAt(ctx context.Context, feed string, partition int32, epoch string, position int64) (int64, error)
	DeadLetterBytes(ctx context.Context, feed string, id int64, part DeadLetterPart, off int64, n int) ([]byte, int64, error)
	DeadLetterReasons(ctx context.Context) ([]ReasonCount, error)
	OpenDeadLetterIDs(ctx context.Context, feed, reason string, after int64, limit int) ([]int64, error)
	OpenDeadLetters(ctx context.Context, since time.Time, limit int64) ([]OpenDeadLetterCount, error)
	EachDeadLetterOf(ctx context.Context, feed string, filter DeadLetterFilter, after int64, limit, preview, maxHeaders int,
		f func(DeadLetterPreview) error) error
	WALBytes() (int64, error)
}

// The SQLite store is both halves.
var (
	_ Writer = (*Store)(nil)
	_ Reader = (*Store)(nil)
)
