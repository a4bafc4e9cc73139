// Package tests holds outboxd's end-to-end tests: they build the real binary,
// run it as a subprocess, kill it with SIGKILL at random moments, and check
// the database and the outputs exactly.
package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// serverBin is the binary as shipped; seamBin is built with the testseams
// tag, for the tests that break a guarantee on purpose (OUTBOXD_TEST_*).
var serverBin, seamBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxd-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Tests run the binary as another user too (file modes do not stop root).
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	serverBin, seamBin = filepath.Join(dir, "server"), filepath.Join(dir, "server-seams")
	for _, b := range [][]string{{"-o", serverBin}, {"-tags", "testseams", "-o", seamBin}} {
		build := exec.Command("go", append(append([]string{"build"}, b...), "./cmd/server")...)
		build.Dir = ".."
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build server:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running server.
type proc struct {
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

type syncBuffer = testutil.SyncBuffer

// start runs the server with args and extra environment: the shipped
// binary, or the one with test seams when env sets one.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	bin := serverBin
	for _, e := range env {
		if strings.HasPrefix(e, "OUTBOXD_TEST_") {
			bin = seamBin
		}
	}
	return startBin(t, bin, env, args...)
}

// startBin runs the program bin (a server, or a program built on package
// server) with args and extra environment.
func startBin(t testing.TB, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// The test's own seed is no setting of the server's (it would warn).
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, envSeed+"=")
	}), env...)
	p := &proc{cmd: cmd, log: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("server log (last run):\n%s", tail(p.log.String(), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop waits until the server is up (its log says "outboxd running"; a
// SIGTERM sent earlier would stop a server still starting, not the running
// one the test means), then sends SIGTERM and returns the exit code.
func (p *proc) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	wait(t, timeout, func() error {
		if strings.Contains(p.log.String(), "outboxd running") {
			return nil
		}
		select {
		case <-p.done:
			return nil // it exited on its own: its code tells the test why
		default:
			return errors.New("the server is not running yet")
		}
	})
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("server did not exit within %v of SIGTERM", timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// wait is testutil.Wait.
var wait = testutil.Wait

// readStore opens the database read side for checks. The server may be
// running: WAL lets readers in.
func readStore(t *testing.T, path string) *outbox.Store {
	t.Helper()
	s := outboxtest.StoreAt(t, path)
	return s
}

// storedPosition is the feed's stored position (-1 when none).
func storedPosition(t *testing.T, dbPath, feed string) int64 {
	t.Helper()
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(dbPath))
	if err != nil {
		return -1
	}
	defer s.Close()
	cps, err := s.ReadPositions(context.Background(), feed)
	if err != nil || len(cps) == 0 {
		return -1
	}
	return cps[0].Position
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestBinary_NoTestSeams: the shipped binary holds none of the seams'
// variables, so nothing in its environment can switch a guarantee off; the
// binary built with the testseams tag does.
func TestBinary_NoTestSeams(t *testing.T) {
	for _, c := range []struct {
		bin  string
		want bool
	}{{serverBin, false}, {seamBin, true}} {
		b, err := os.ReadFile(c.bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"OUTBOXD_TEST_REWIND", "OUTBOXD_TEST_FAIL_COMMITS"} {
			if got := bytes.Contains(b, []byte(v)); got != c.want {
				t.Errorf("%s holds %s: %v, want %v", filepath.Base(c.bin), v, got, c.want)
			}
		}
	}
}

// killDB is where a kill -9 test's server keeps its store: a file in dir,
// or a PostgreSQL database of the test's own under
// OUTBOXD_TEST_STORE=postgres (the same suite on the PostgreSQL store).
func killDB(t *testing.T, dir string) string {
	t.Helper()
	if outboxtest.OnPostgres() {
		return pgtest.New(t).DSN
	}
	return filepath.Join(dir, "outboxd.db")
}
