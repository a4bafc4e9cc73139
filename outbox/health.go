package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Readiness is answered from what the writer already knows, never by
// writing: a probe that writes waits behind the batch holding the one
// writer connection, so a busy, healthy server would look unready.
const (
	// writeFresh is how long a successful write vouches for the database
	// on its own.
	writeFresh = 5 * time.Second
	// probeFor is how long an idle store's file checks are reused.
	probeFor = time.Second
)

// writeHealth remembers how the store's writes went. It is safe for
// concurrent use.
type writeHealth struct {
	mu      sync.Mutex
	okAt    time.Time // the last write that succeeded
	failAt  time.Time // the last write that failed for a reason of the store
	failErr error

	probeAt  time.Time // when the idle checks last ran
	probeErr error
}

// noteWrite records the outcome of a write attempt: a commit, a BEGIN, a
// statement of a transaction, one of the store's own writes. Errors that
// say nothing of the database's health are ignored: a broken constraint
// (the item's fault) and a cancelled context (a shutdown).
func (s *Store) noteWrite(err error) {
	if err != nil && (Classify(err) == ClassConstraint ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return
	}
	h := &s.health
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.okAt = now
		return
	}
	h.failAt, h.failErr = now, err
}

// noteStatement records a failed statement of a transaction when its error
// is the store's (a full disk, an I/O error): a processor's own errors say
// nothing of the database.
func (s *Store) noteStatement(err error) error {
	if err != nil && Classify(err).Store() {
		s.noteWrite(err)
	}
	return err
}

// CheckWritable reports whether the database takes writes, without the
// writer connection, so it never waits behind a batch. It returns an error
// for a closed store and for a path that no longer names the open database
// (CheckPath); the error of the last write when that write failed (and none
// succeeded since); nil when a write succeeded in the last few seconds;
// otherwise, for an idle store, the outcome of cheap checks of the files
// (the database and its WAL open for writing, space left on their disk),
// done at most once a second. A failed write is reported until a later one
// succeeds: the ingest loop retries a stalled commit at least every 30s.
// Safe for concurrent use.
func (s *Store) CheckWritable(ctx context.Context) error {
	if s.closed.Load() {
		return errors.New("the database is closed")
	}
	if err := s.CheckPath(); err != nil {
		return err // deleted or replaced: SQLite would go on writing to the unlinked file
	}
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if !h.failAt.IsZero() && !h.failAt.Before(h.okAt) {
		return fmt.Errorf("the last write (%s ago) failed: %s: %w",
			now.Sub(h.failAt).Round(time.Millisecond), Classify(h.failErr), h.failErr)
	}
	if !h.okAt.IsZero() && now.Sub(h.okAt) < writeFresh {
		return nil
	}
	if h.probeAt.IsZero() || now.Sub(h.probeAt) >= probeFor {
		h.probeAt, h.probeErr = now, s.probeFiles(ctx)
	}
	return h.probeErr
}

// probeFiles checks what an idle store can check without writing: the
// database file and its WAL open for writing (a read-only mount, an
// immutable file or lost permissions fail here), and their disk has space.
func (s *Store) probeFiles(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.pg {
		return s.probePG(ctx)
	}
	for _, p := range []string{s.cfg.Path, s.cfg.Path + "-wal"} {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if errors.Is(err, os.ErrNotExist) && p != s.cfg.Path {
			continue // no WAL yet: SQLite creates it in the same directory
		}
		if err != nil {
			return fmt.Errorf("database not writable: %w", err)
		}
		f.Close()
	}
	free, err := freeBytes(filepath.Dir(s.cfg.Path))
	if err != nil {
		return fmt.Errorf("database disk: %w", err)
	}
	if free == 0 {
		return fmt.Errorf("disk full: no space left on the database's file system (%s)", filepath.Dir(s.cfg.Path))
	}
	return nil
}
