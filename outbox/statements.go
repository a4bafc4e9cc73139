package outbox

import (
	"context"
	"database/sql/driver"
	"fmt"
)

// The statements below are the ones a Tx runs, exported so that a tool that
// must write exactly what the store writes (the bench's floors) runs the
// same text rather than a copy.

// OutboxChunkInsertSQL is the statement Commit writes n chunks of outputs
// with (see PackOutputs), binding for each: its last id, its count, its
// least position, feed, partition, epoch, topic, the creation time, its
// bytes and its body. n is
// a chunk count (ChunkSize with at most OutboxChunkInsertMax), else the
// text is empty.
func OutboxChunkInsertSQL(n int) string { return insertChunksBySize[n] }

// OutboxChunkInsertMax is the most chunks one OutboxChunkInsertSQL
// statement writes.
const OutboxChunkInsertMax = chunkInsertMax

// OutboxLastIDSQL reads the largest outbox id assigned (one row, one
// column); OutboxSetLastIDSQL sets it, binding the new one. Commit runs
// each once.
const (
	OutboxLastIDSQL    = lastIDSQL
	OutboxSetLastIDSQL = setLastIDSQL
)

// PackedChunk is a chunk of outputs as PackOutputs makes it: N rows, from
// the Start'th, their body, their least position, their backlog bytes.
type PackedChunk struct {
	Start, N int
	Body     []byte
	Position int64
	Bytes    int64
}

// PackOutputs packs rows (their feed, partition, epoch, topic, position,
// n, key, value and headers) in chunks as Commit does.
func PackOutputs(rows []Row) []PackedChunk {
	_, body, spans := packRows(rows, 0, len(rows), nil, nil, &compressor{})
	out := make([]PackedChunk, len(spans))
	for i, sp := range spans {
		out[i] = PackedChunk{Start: sp.start, N: sp.n, Body: body[sp.from:sp.to:sp.to], Position: sp.position, Bytes: sp.bytes}
	}
	return out
}

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
