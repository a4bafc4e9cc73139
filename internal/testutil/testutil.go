// Package testutil holds what outboxd's tests need in more than one
// package and that knows nothing of outboxd: waiting for a condition with
// a deadline, a log buffer safe for concurrent use, a small disk that can
// be filled. It imports no package of outboxd, so every test may import
// it; a store for a test is outbox/outboxtest's. It is imported by tests
// only.
package testutil

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
