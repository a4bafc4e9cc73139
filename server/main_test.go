package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
)

// wait is testutil.Wait.
var wait = testutil.Wait

// running is a Main running in-process.
type running struct {
	m      *Main
	cancel context.CancelFunc
	done   chan error
}

// runMain parses args and runs the service until the test ends.
func runMain(t *testing.T, args ...string) *running {
	t.Helper()
	cfg, err := ParseConfig(args, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{m: NewMain(cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))),
		cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- r.m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// ready waits until the service serves.
func (r *running) ready(t *testing.T) {
	t.Helper()
	select {
	case <-r.m.Ready():
	case err := <-r.done:
		t.Fatalf("Run returned %v before it served", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready within 30s")
	}
}

// result waits for Run to return by itself and returns its error.
func (r *running) result(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

// stop cancels Run and returns its error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.result(t, 30*time.Second)
}

// nextClaim claims the database at db and returns the generation: one
// more than the claims made before.
func nextClaim(t *testing.T, db string) int64 {
	t.Helper()
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	gen, err := s.Claim(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

// position is the ledger feed's stored position (-1 when none).
func position(t *testing.T, db string) int64 {
	t.Helper()
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cps, err := s.ReadPositions(context.Background(), "l")
	if err != nil || len(cps) == 0 {
		return -1
	}
	return cps[0].Position
}

// ledgerSetup writes an input of two lines and returns it, the database
// path and the arguments of a ledger service on them, relay off.
func ledgerSetup(t *testing.T) (input, db string, args []string) {
	dir := t.TempDir()
	input, db = filepath.Join(dir, "in.csv"), filepath.Join(dir, "data", "outboxd.db")
	if err := os.WriteFile(input, []byte("a,1\nb,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return input, db, []string{"--db", db, "--feed", "l=file:" + input, "--processor", "l=ledger",
		"--relay", "none", "--http", "127.0.0.1:0"}
}

func appendLine(t *testing.T, path, line string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func waitPosition(t *testing.T, db string, want int64) {
	t.Helper()
	wait(t, 30*time.Second, func() error {
		if got := position(t, db); got != want {
			return fmt.Errorf("stored position %d, want %d", got, want)
		}
		return nil
	})
}

func TestMain_Run(t *testing.T) {
	input, db, args := ledgerSetup(t)
	r := runMain(t, args...)
	r.ready(t)
	res, err := http.Get(r.m.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %s", res.Status)
	}
	waitPosition(t, db, int64(len("a,1\nb,2\n")))
	waitPosition(t, db, appendLine(t, input, "c,3\n"))
	var st struct{ Topics []string }
	res, err = http.Get(r.m.URL() + "/feeds/l/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(res.Body).Decode(&st)
	res.Body.Close()
	if err != nil || strings.Join(st.Topics, " ") != "l.out l.dlq" {
		t.Fatalf("topics %q (%v), want l.out l.dlq", st.Topics, err)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
	if gen := nextClaim(t, db); gen != 2 {
		t.Fatalf("the next claim is generation %d, want 2: the service claims once", gen)
	}
}

// TestMain_FailedStartBeside starts, beside a running service, services on
// the same database that cannot run: each fails with a *ConfigError before
// it claims the database, and the running one goes on applying.
func TestMain_FailedStartBeside(t *testing.T) {
	input, db, args := ledgerSetup(t)
	a := runMain(t, args...)
	a.ready(t)
	end := int64(len("a,1\nb,2\n"))
	waitPosition(t, db, end)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"PortInUse", []string{"--http", strings.TrimPrefix(a.m.URL(), "http://")}, "address already in use"},
		{"DirectoryAsInput", []string{"--feed", "l=file:" + dir}, dir + ": is a directory"},
		{"InputDirectoryMissing", []string{"--feed", "l=file:" + filepath.Join(dir, "none", "in.csv")}, ": no such file"},
		{"DevBrokerPortInUse", []string{"--relay", "exactly-once", "--dev-broker-addr", strings.TrimPrefix(a.m.URL(), "http://")},
			"--dev-broker-addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bArgs := append([]string{}, args...)
			if tc.args[0] == "--feed" {
				bArgs[3] = tc.args[1] // another source for the same feed, not a second one
				tc.args = nil
			}
			err := runMain(t, append(bArgs, tc.args...)...).result(t, 30*time.Second)
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want a *ConfigError saying %q", err, tc.want)
			}
			if err := a.m.Store.CheckOwner(context.Background()); err != nil {
				t.Fatalf("the running service lost its database: %v", err)
			}
			end = appendLine(t, input, "d,4\n")
			waitPosition(t, db, end)
		})
	}
	if err := a.stop(t); err != nil {
		t.Fatalf("the running service: %v", err)
	}
}

// TestMain_StopWhileStarting runs a service whose context is done before
// it starts: Run returns nil and never claims the database.
func TestMain_StopWhileStarting(t *testing.T) {
	_, db, args := ledgerSetup(t)
	cfg, err := ParseConfig(args, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := NewMain(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))).Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if gen := nextClaim(t, db); gen != 1 {
		t.Fatalf("the next claim is generation %d, want 1: a service stopped while starting claims nothing", gen)
	}
}

// TestCommandSignals_SignalFirst gives the command a SIGTERM caught before
// it ran: it exits 0 without claiming the database.
func TestCommandSignals_SignalFirst(t *testing.T) {
	_, db, args := ledgerSetup(t)
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGTERM
	var out, errOut bytes.Buffer
	if code := CommandSignals(args, &out, &errOut, sigs); code != ExitOK {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, errOut.String())
	}
	if gen := nextClaim(t, db); gen != 1 {
		t.Fatalf("the next claim is generation %d, want 1", gen)
	}
}

// TestMain_DatabaseLost runs a service and takes its database away: Run
// ends within seconds with the error that says how, and Command's exit
// code for it.
func TestMain_DatabaseLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		take func(t *testing.T, db string)
		is   error
		code int
	}{
		{"Deleted", func(t *testing.T, db string) {
			for _, suf := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(db + suf); err != nil {
					t.Fatal(err)
				}
			}
		}, outbox.ErrMoved, ExitFailed},
		{"Claimed", func(t *testing.T, db string) { nextClaim(t, db) }, outbox.ErrFenced, ExitFenced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, db, args := ledgerSetup(t)
			r := runMain(t, args...)
			r.ready(t)
			waitPosition(t, db, int64(len("a,1\nb,2\n")))
			tc.take(t, db)
			err := r.result(t, 10*time.Second)
			if !errors.Is(err, tc.is) {
				t.Fatalf("Run = %v, want %v", err, tc.is)
			}
			var logged bytes.Buffer
			if code := exitCode(err, slog.New(slog.NewTextHandler(&logged, nil)), io.Discard); code != tc.code {
				t.Fatalf("exit code %d, want %d", code, tc.code)
			}
			if n := strings.Count(logged.String(), "\n"); n != 1 || !strings.Contains(logged.String(), "level=ERROR") {
				t.Fatalf("logged %q, want one error line", logged.String())
			}
			copies, _ := filepath.Glob(db + ".rescued-*")
			if tc.is != outbox.ErrMoved {
				if len(copies) != 0 {
					t.Fatalf("copies %v of a database that is still in place", copies)
				}
				return
			}
			if len(copies) != 1 || !strings.Contains(err.Error(), "saved at "+copies[0]) {
				t.Fatalf("copies %v, error %q: want one copy, named in the error", copies, err)
			}
			if got := position(t, copies[0]); got != int64(len("a,1\nb,2\n")) {
				t.Fatalf("the copy's stored position %d, want %d", got, len("a,1\nb,2\n"))
			}
		})
	}
}

func TestCheckDatabasePath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "plain")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"New", filepath.Join(dir, "outboxd.db"), ""},
		{"NewDirectories", filepath.Join(dir, "a", "b", "outboxd.db"), ""},
		{"Existing", file, ""},
		{"Directory", dir, dir + " is a directory, not a database file"},
		{"UnderAFile", filepath.Join(file, "outboxd.db"), file + " is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkDatabasePath(tc.path)
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkDatabasePath(%s) = %v, want %q", tc.path, err, tc.want)
			}
		})
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the directory holds %v (%v): the checks must create nothing", entries, err)
	}
	t.Run("NotWritable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root writes anywhere: tests/TestLifecycle_ConfigMistakes runs this case as another user")
		}
		locked := filepath.Join(dir, "locked")
		if err := os.Mkdir(locked, 0o555); err != nil {
			t.Fatal(err)
		}
		if err := checkDatabasePath(filepath.Join(locked, "outboxd.db")); err == nil ||
			!strings.Contains(err.Error(), "cannot create files in "+locked) {
			t.Fatalf("checkDatabasePath = %v", err)
		}
	})
}
