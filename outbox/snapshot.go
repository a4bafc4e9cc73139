package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
)

// ErrReplayCopy is returned by Claim for a database made for a replay (a
// recording's snapshot, a replay's output): a server never runs on one,
// since its relay would publish under the live database's transactional
// id and fence the live relay, and its outputs again.
var ErrReplayCopy = errors.New("the database is a copy made for a replay, not one a server runs on")

// replayCopyKey is the meta key that marks a replay copy; its value says
// what the copy is.
const replayCopyKey = "replay_copy"

// Snapshot writes a consistent copy of the database as of now to path,
// marked as a replay copy saying note (see ErrReplayCopy). The copy
// appears at path whole or not at all (it is written beside it and
// renamed), and is synced to disk. It holds the writer connection while it
// copies, so every writer waits for it. It fails when path exists.
func (s *Store) Snapshot(ctx context.Context, path, note string) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("snapshot to %s: the file exists", path)
	}
	tmp := path + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("snapshot to %s: %w", path, err)
	}
	if _, err := s.db.ExecContext(ctx, "VACUUM INTO ?", tmp); err != nil {
		// Interrupted (a stop) or failed: what it wrote is no snapshot.
		removeCopy(tmp)
		return fmt.Errorf("snapshot to %s: %w", path, err)
	}
	if err := markFile(ctx, tmp, note); err != nil {
		removeCopy(tmp)
		return fmt.Errorf("snapshot to %s: %w", path, err)
	}
	if err := syncRename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("snapshot to %s: %w", path, err)
	}
	return nil
}

// removeCopy removes an unfinished copy and SQLite's files beside it.
func removeCopy(path string) {
	for _, suffix := range []string{"", "-journal", "-wal", "-shm"} {
		os.Remove(path + suffix)
	}
}

// SnapshotBytes estimates the size of a Snapshot taken now: the
// database's pages in use (a snapshot leaves the free ones out). A
// recorder makes room for it under its total cap before taking one.
func (s *Store) SnapshotBytes(ctx context.Context) (int64, error) {
	var pages, free, size int64
	for _, q := range []struct {
		pragma string
		into   *int64
	}{{"page_count", &pages}, {"freelist_count", &free}, {"page_size", &size}} {
		if err := s.rdb.GetContext(ctx, q.into, "PRAGMA "+q.pragma); err != nil {
			return 0, fmt.Errorf("estimate a snapshot's size: %w", err)
		}
	}
	return (pages - free) * size, nil
}

// markFile marks the database file at path as a replay copy.
func markFile(ctx context.Context, path, note string) error {
	db, err := sqlx.Open("sqlite", "file:"+uriPath.Replace(path)+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer db.Close()
	return markReplayCopy(ctx, db, note)
}

func markReplayCopy(ctx context.Context, db sqlx.ExecerContext, note string) error {
	_, err := db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES (?, ?)
ON CONFLICT(key) DO UPDATE SET value = excluded.value`, replayCopyKey, note)
	if err != nil {
		return fmt.Errorf("mark the database as a replay copy: %w", err)
	}
	return nil
}

// syncRename syncs the file tmp, renames it to path and syncs the
// directory, so that after a crash path is either absent or whole.
func syncRename(tmp, path string) error {
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	serr := f.Sync()
	if err := f.Close(); serr == nil {
		serr = err
	}
	if serr != nil {
		return serr
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir syncs a directory, so the names created in it survive a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// MarkReplayCopy marks the database as a replay copy saying note: Claim
// refuses it from then on.
func (s *Store) MarkReplayCopy(ctx context.Context, note string) error {
	err := markReplayCopy(ctx, s.db, note)
	s.noteWrite(err)
	return err
}

// ReplayCopy returns what the database is a replay copy of, and whether it
// is one.
func (s *Store) ReplayCopy(ctx context.Context) (string, bool, error) {
	return replayCopyOf(ctx, s.rdb)
}

func replayCopyOf(ctx context.Context, q sqlx.QueryerContext) (string, bool, error) {
	var note string
	err := sqlx.GetContext(ctx, q, &note, `SELECT value FROM meta WHERE key = ?`, replayCopyKey)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read whether the database is a replay copy: %w", err)
	}
	return note, true, nil
}

// refuseReplayCopy fails with ErrReplayCopy for a replay copy.
func refuseReplayCopy(ctx context.Context, q sqlx.QueryerContext) error {
	note, ok, err := replayCopyOf(ctx, q)
	if err != nil || !ok {
		return err
	}
	return fmt.Errorf("%w (%s)", ErrReplayCopy, note)
}

// CopyDatabase writes a consistent copy of the database at src to dst,
// marked as a replay copy saying note: src is only read, so a server may
// be running on it. dst appears whole or not at all; it fails when dst
// exists or src is not an outboxd database.
func CopyDatabase(ctx context.Context, src, dst, note string) error {
	s, err := OpenExisting(ctx, src) // checks it is one
	if err != nil {
		return err
	}
	s.Close()
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("copy %s to %s: the file exists", src, dst)
	}
	db, err := sqlx.Open("sqlite", "file:"+uriPath.Replace(src)+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer db.Close()
	tmp := dst + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", tmp); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := markFile(ctx, tmp, note); err != nil {
		removeCopy(tmp)
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := syncRename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}
