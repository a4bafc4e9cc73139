package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// ErrMoved is returned (wrapped) by CheckPath, and by Tx.Commit, when the
// database's path no longer names the file the store has open: it was
// deleted, or replaced by another file (another device or inode). SQLite
// goes on writing to the file it has open, which no later process will
// ever open, so everything committed from then on would vanish at exit.
// The process must stop.
//
// An error wrapping ErrMoved also matches ErrFenced: either way this
// process has lost its database and must stop writing, not retry.
var ErrMoved = errors.New("the database file at the path is not the one this process has open")

// dbFileSuffixes are the files SQLite keeps beside a WAL database while it
// is open: the database itself, its write-ahead log and the WAL index.
// SQLite removes the last two only when the last connection closes, and the
// store holds its writer connection for its whole life, so all three stay.
var dbFileSuffixes = []string{"", "-wal", "-shm"}

// openedFiles remembers which files the store opened at its path.
type openedFiles struct {
	mu    sync.Mutex
	infos []os.FileInfo // per dbFileSuffixes; nil when the file was absent at open
}

// movedError says which of the database's files changed and how.
type movedError struct {
	path string
	how  string // "was deleted" or "was replaced by another file"
}

func (e *movedError) Error() string {
	return fmt.Sprintf("%s %s while this process had it open: %v", e.path, e.how, ErrMoved)
}

// Is makes the error match ErrMoved and ErrFenced.
func (e *movedError) Is(target error) bool { return target == ErrMoved || target == ErrFenced }

// recordFiles remembers the identity (device and inode) of the database's
// files right after they were opened.
func (s *Store) recordFiles() error {
	infos := make([]os.FileInfo, len(dbFileSuffixes))
	for i, suf := range dbFileSuffixes {
		fi, err := os.Stat(s.cfg.Path + suf)
		switch {
		case errors.Is(err, fs.ErrNotExist) && suf != "":
		case err != nil:
			return fmt.Errorf("open %s: stat: %w", s.cfg.Path+suf, err)
		default:
			infos[i] = fi
		}
	}
	s.files.mu.Lock()
	s.files.infos = infos
	s.files.mu.Unlock()
	return nil
}

// CheckPath reports whether the store's path still names the database it
// has open: nil when the database file, its -wal and its -shm files at the
// path are the ones opened; an error wrapping ErrMoved that says which file
// was deleted or replaced otherwise, or the stat error itself. It costs
// three stat calls and no SQL, so it is cheap enough for every commit and
// for readiness probes. It is safe for concurrent use.
func (s *Store) CheckPath() error {
	if s.pg {
		return nil // a server's database has no path to lose
	}
	s.files.mu.Lock()
	infos := s.files.infos
	s.files.mu.Unlock()
	for i, suf := range dbFileSuffixes {
		if err := s.checkFile(s.cfg.Path+suf, infos[i]); err != nil {
			return err
		}
	}
	return nil
}

// checkFile compares the file at path with the one opened (nil: it was
// absent then; a WAL file appearing later is SQLite's own doing).
func (s *Store) checkFile(path string, opened os.FileInfo) error {
	if opened == nil {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &movedError{path: absPath(path), how: "was deleted"}
	case err != nil:
		return fmt.Errorf("check database file: %w", err)
	case !os.SameFile(opened, fi):
		return &movedError{path: absPath(path), how: "was replaced by another file"}
	}
	return nil
}

// AbsPath is the absolute path of the database file, as this process sees
// it (symbolic links in its directory resolved where they can be): the
// path that names this database on this host.
func (s *Store) AbsPath() string { return absPath(s.cfg.Path) }

func absPath(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs))
	}
	return abs
}

// acceptedNewKey is the meta key recording that an operator started this
// database afresh on purpose, beside the progress of an earlier one.
const acceptedNewKey = "accepted_as_new_at"

// AcceptAsNew records, once, that an operator started this database afresh
// on purpose although an earlier database at its path had published: the
// relay then publishes from it without asking again. It returns the time
// first recorded.
func (s *Store) AcceptAsNew(ctx context.Context) (time.Time, error) {
	now := strconv.FormatInt(s.Now().UnixNano(), 10)
	if _, err := s.db.ExecContext(ctx, `INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO NOTHING`,
		acceptedNewKey, now); err != nil {
		return time.Time{}, fmt.Errorf("record the database as new: %w", err)
	}
	at, _, err := s.AcceptedAsNew(ctx)
	return at, err
}

// AcceptedAsNew returns when AcceptAsNew was first called on this database;
// ok is false when it never was.
func (s *Store) AcceptedAsNew(ctx context.Context) (at time.Time, ok bool, err error) {
	var v string
	err = s.rdb.GetContext(ctx, &v, `SELECT value FROM meta WHERE key = ?`, acceptedNewKey)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read whether the database was accepted as new: %w", err)
	}
	ns, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read whether the database was accepted as new: %q: %w", v, err)
	}
	return time.Unix(0, ns), true, nil
}

// emptyWAL checkpoints the whole write-ahead log into the database file the
// store has open, and truncates the log to nothing. Best effort: it runs on
// the way out of a store that lost its path.
func (s *Store) emptyWAL() {
	var busy, frames, done int
	_ = s.db.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &frames, &done)
}

// SaveCopy writes a consistent copy of the database, as this store sees
// it, to path, which must not exist. It reads through the files the store
// has open, so it works after the database file was deleted or replaced:
// the copy is then the only one left of what this store committed. It
// holds the writer connection while it copies.
func (s *Store) SaveCopy(ctx context.Context, path string) error {
	if _, err := s.db.ExecContext(ctx, "VACUUM INTO ?", path); err != nil {
		return fmt.Errorf("copy the database to %s: %w", path, err)
	}
	return nil
}
