package server

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/outbox"
)

// ConfigError is a configuration the server cannot start with, found
// before it claimed its database: a server already running on the
// database is untouched. Command prints it on one line and exits with
// ExitConfig.
type ConfigError struct{ Err error }

// Error is the underlying error's message.
func (e *ConfigError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

func configErr(format string, args ...any) error {
	return &ConfigError{Err: fmt.Errorf(format, args...)}
}

// preflight finds what would make the start fail, before the server
// opens its database: the SQL processors' statements, the file feeds' paths, the database's path, the
// HTTP address (it binds it, keeping the listener for the API) and the
// dev broker (it starts it when one is needed). It creates no file;
// close releases the listener and the broker. Every failure is a
// *ConfigError.
func (m *Main) preflight() error {
	if err := m.Config.Record.check(m.Config.FeedNames()); err != nil {
		return &ConfigError{Err: err}
	}
	for _, name := range m.Config.FeedNames() {
		fc := m.Config.Feeds[name]
		kind, path, _ := strings.Cut(fc.Source, ":")
		if kind != "file" {
			continue
		}
		if err := filefeed.Check(path); err != nil {
			return configErr("--feed %s: %w", name, err)
		}
	}
	if err := m.checkSQLProcessors(); err != nil {
		return err
	}
	if err := m.checkRecordEngine(); err != nil {
		return err
	}
	if outbox.IsPostgres(m.Config.DB) {
		// A server's database: Open says whether it answers.
	} else if err := checkDatabasePath(m.Config.DB); err != nil {
		return configErr("--db %s: %w", m.Config.DB, err)
	}
	ln, err := net.Listen("tcp", m.Config.HTTP)
	if err != nil {
		return configErr("--http %s: %w", m.Config.HTTP, err)
	}
	m.listener = ln
	if err := m.resolveBrokers(); err != nil {
		return configErr("--dev-broker-addr %s: %w", m.Config.DevBroker.Addr, err)
	}
	return nil
}

// checkDatabasePath checks, creating nothing, that the database can be
// opened for writing at path: an existing path must be a regular file
// this process can open for reading and writing, and the nearest existing
// directory above it one where it can create files (SQLite creates the
// -wal and -shm files beside the database; Open creates missing
// directories). Opening and closing the file here is safe: this process
// holds no SQLite lock on it yet, and a close only drops the closing
// process's own locks.
func checkDatabasePath(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("%s is a directory, not a database file", path)
	case err == nil && !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file (%v)", path, fi.Mode().Type())
	case err == nil:
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("%s cannot be opened for writing: %w", path, pathless(err))
		}
		f.Close()
	case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
		return err // ENOTDIR: a file where a directory should be, named next
	}
	dir, err := nearestDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	probe, err := os.CreateTemp(dir, ".outboxd-probe-*")
	if err != nil {
		return fmt.Errorf("cannot create files in %s: %w", dir, pathless(err))
	}
	probe.Close()
	return os.Remove(probe.Name())
}

// nearestDir returns dir, or its nearest ancestor that exists; an error
// when that is not a directory.
func nearestDir(dir string) (string, error) {
	for {
		fi, err := os.Stat(dir)
		switch {
		case err == nil && fi.IsDir():
			return dir, nil
		case err == nil:
			return "", fmt.Errorf("%s is not a directory", dir)
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no directory of %s exists", dir)
		}
		dir = parent
	}
}

// pathless drops the operation and path of an *fs.PathError whose message
// names the path already.
func pathless(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// ErrRecordSQLiteOnly says why a feed is not recorded on a PostgreSQL
// store: a recording starts from a snapshot of the database (VACUUM INTO
// a file), which a replay runs on, and a replay's diff compares two SQLite
// files.
var ErrRecordSQLiteOnly = errors.New("a recording starts from a SQLite snapshot of the database and replays into a SQLite file: record on a SQLite --db")

// checkRecordEngine refuses a recorded feed on --db postgres://, before
// the database is touched.
func (m *Main) checkRecordEngine() error {
	if !outbox.IsPostgres(m.Config.DB) {
		return nil
	}
	for _, name := range m.Config.FeedNames() {
		if m.Config.Record.dirOf(name) != "" {
			return configErr("--record %s: %v, not on --db postgres://", name, ErrRecordSQLiteOnly)
		}
	}
	return nil
}
