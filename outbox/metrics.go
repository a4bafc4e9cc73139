package outbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// ReasonCount is how many dead letters of a feed have one reason.
type ReasonCount struct {
	Feed   string `db:"feed"`
	Reason string `db:"reason"`
	N      int64  `db:"n"`
}

// DeadLetterReasons counts the dead letters of every feed by reason,
// requeued ones included (a dead letter stays stored when requeued), so
// each count only grows. It reads the read pool, never waiting for a
// writer, and an index, not the rows.
func (s *Store) DeadLetterReasons(ctx context.Context) ([]ReasonCount, error) {
	var out []ReasonCount
	err := s.rdb.SelectContext(ctx, &out,
		`SELECT feed, reason, COUNT(*) AS n FROM dead_letters GROUP BY feed, reason ORDER BY feed, reason`)
	if err != nil {
		return nil, fmt.Errorf("count dead letters by reason: %w", err)
	}
	return out, nil
}

// WALBytes returns the size of the database's write-ahead log file, 0
// when there is none. It only stats the file.
func (s *Store) WALBytes() (int64, error) {
	if s.pg {
		return 0, nil // the server's WAL is not the store's to count
	}
	fi, err := os.Stat(s.cfg.Path + "-wal")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("stat the write-ahead log: %w", err)
	}
	return fi.Size(), nil
}

// CheckpointResult is what a WAL checkpoint did.
type CheckpointResult struct {
	// Duration is how long the checkpoint took, waiting for the writer
	// connection excluded.
	Duration time.Duration
	// Busy is true when the checkpoint could not copy every frame (a
	// reader still uses them); the next one goes on.
	Busy bool
	// LogFrames is the log's size in frames, Checkpointed how many of them
	// are in the database file now.
	LogFrames, Checkpointed int64
}

// Checkpoint runs a PASSIVE checkpoint of the write-ahead log on the
// writer connection: it copies committed frames into the database file
// without waiting for readers and without blocking them, and never
// changes what is committed. SQLite checkpoints by itself inside commits
// too; this one measures the cost and keeps the log short when commits
// are rare.
func (s *Store) Checkpoint(ctx context.Context) (CheckpointResult, error) {
	if s.pg {
		return CheckpointResult{}, nil // PostgreSQL checkpoints by itself
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return CheckpointResult{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer conn.Close()
	var busy int
	var r CheckpointResult
	start := time.Now()
	err = conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &r.LogFrames, &r.Checkpointed)
	r.Duration = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("checkpoint: %w", err)
	}
	r.Busy = busy != 0 || r.Checkpointed < r.LogFrames
	return r, nil
}
