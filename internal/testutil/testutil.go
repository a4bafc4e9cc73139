// Package testutil holds what outboxd's tests need in more than one
// package: waiting for a condition with a deadline, opening a store on a
// temporary file, a log buffer safe for concurrent use, a small disk that
// can be filled. It is imported by tests only.
package testutil

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// PollInterval is how often Wait evaluates its condition.
const PollInterval = 20 * time.Millisecond

// Wait evaluates cond every PollInterval until it returns nil, and fails
// the test with cond's last error once timeout has passed. cond runs at
// least once, and once more after the deadline has passed, so a condition
// met at the last moment is not reported as a timeout.
func Wait(tb testing.TB, timeout time.Duration, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v: %v", timeout, err)
		}
		time.Sleep(PollInterval)
	}
}

// Must fails the test at once when err is not nil.
func Must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// OpenStore opens a store with cfg and closes it when the test ends; it
// fails the test when the store does not open.
func OpenStore(tb testing.TB, cfg outbox.Config) *outbox.Store {
	tb.Helper()
	s, err := outbox.Open(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// TempStore is OpenStore with the default configuration, on a new file in
// the test's temporary directory.
func TempStore(tb testing.TB) *outbox.Store {
	tb.Helper()
	return NewStore(tb, nil)
}

// EnvStore is the environment variable that selects the engine of the
// stores NewStore and TempStore open: "postgres" gives each test a
// PostgreSQL database of its own (pgtest), anything else a SQLite file.
// It runs a package's store tests against PostgreSQL unchanged:
// OUTBOXD_TEST_STORE=postgres go test ./outbox.
const EnvStore = "OUTBOXD_TEST_STORE"

// OnPostgres reports whether EnvStore selects PostgreSQL.
func OnPostgres() bool { return os.Getenv(EnvStore) == "postgres" }

// SQLiteOnly skips a test of what only the SQLite engine has (its file,
// its PRAGMAs, its WAL) when EnvStore selects PostgreSQL, in one line
// that says why: what the test checks that PostgreSQL has no counterpart
// of.
func SQLiteOnly(tb testing.TB, why string) {
	tb.Helper()
	if OnPostgres() {
		tb.Skip("SQLite only (" + EnvStore + "=postgres): " + why)
	}
}

// NewStore is OpenStore on a new file in the test's temporary directory
// (a new PostgreSQL database under EnvStore=postgres), with the default
// configuration changed by cfg (when not nil).
func NewStore(tb testing.TB, cfg func(*outbox.Config)) *outbox.Store {
	tb.Helper()
	c := outbox.DefaultConfig(filepath.Join(tb.TempDir(), "t.db"))
	if OnPostgres() {
		c.Path = pgtest.New(tb).DSN
	}
	if cfg != nil {
		cfg(&c)
	}
	return OpenStore(tb, c)
}

// SyncBuffer is a bytes.Buffer that may be written (a logger, a child
// process's output) while the test reads it. The zero value is empty and
// ready.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what has been written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Bytes returns a copy of what has been written so far.
func (s *SyncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// Count returns how many times sub occurs in what has been written so
// far (how many log lines say something, when sub is in one line only).
func (s *SyncBuffer) Count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Count(s.b.Bytes(), []byte(sub))
}

// MountTmpfs mounts a tmpfs of size (mount's syntax: "1m") at a new
// directory, unmounted when the test ends, so that a test can fill a disk
// without filling the machine's. It skips the test when it cannot mount
// (not root, no mount permission in a container).
func MountTmpfs(tb testing.TB, size string) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("a full disk needs a small tmpfs, and mounting one needs root: not root")
	}
	dir := tb.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		tb.Skipf("cannot mount a tmpfs here (%v: %s): a full disk cannot be made", err, strings.TrimSpace(string(out)))
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			tb.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// FillDisk writes a file in dir until its disk is full (ENOSPC), and
// returns the file's path: removing it frees the disk again.
func FillDisk(tb testing.TB, dir string) string {
	tb.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				tb.Fatalf("fill %s: %v", path, err)
			}
			return path
		}
	}
}

// Equal fails the test at once, naming what was compared, when got is not
// want.
func Equal[T comparable](tb testing.TB, what string, got, want T) {
	tb.Helper()
	if got != want {
		tb.Fatalf("%s = %v, want %v", what, got, want)
	}
}
