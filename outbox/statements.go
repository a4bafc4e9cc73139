package outbox

import (
	"context"
	"database/sql/driver"
	"fmt"
)

// The statements below are the ones a Tx runs, exported so that a tool that
// must write exactly what the store writes (the bench's floors) runs the
// same text rather than a copy.

// OutboxInsertSQL is the statement Commit writes n output rows of one feed,
// partition, epoch and topic with: those four and the creation time are
// bound first, once ((feed, partition, epoch, topic, created_at)), then
// (position, n, key, value, headers) for each row. n is a chunk size
// (ChunkSize with at most OutboxInsertChunk), else the text is empty.
func OutboxInsertSQL(n int) string { return insertSharedBySize[n] }

// OutboxInsertChunk is the most rows one OutboxInsertSQL statement writes.
const OutboxInsertChunk = flushChunk

// PositionUpsertSQL is the statement SetPosition runs, binding feed,
// partition, epoch, position, source end and the update time.
const PositionUpsertSQL = upsertPosition

// DriverArgs appends vs to args as the next ordinals of a driver
// statement's arguments, as a Tx builds those of its statements.
func DriverArgs(args []driver.NamedValue, vs ...driver.Value) []driver.NamedValue {
	return appendValues(args, vs...)
}

// DriverBytes is b as a Tx binds a key, value or headers: NULL for nil, a
// BLOB otherwise.
func DriverBytes(b []byte) driver.Value { return driverBytes(b) }

// StatsUpdateSQL is the statement AddStats runs, binding applied, replays
// skipped, retries, dead-lettered, completion failures, epoch changes, the
// last applied time and the feed.
const StatsUpdateSQL = addStats

// MaxRelayProgress is the largest outbox id any relay of this database has
// recorded in SQLite as published (0 for none), read through the read pool.
// The exactly-once relay records it right after each Kafka commit.
func (s *Store) MaxRelayProgress(ctx context.Context) (int64, error) {
	var id int64
	if err := s.rdb.GetContext(ctx, &id, `SELECT coalesce(max(last_id), 0) FROM relay_progress`); err != nil {
		return 0, fmt.Errorf("read relay progress: %w", err)
	}
	return id, nil
}
