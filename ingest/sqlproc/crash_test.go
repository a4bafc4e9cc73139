package sqlproc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// Environment of the child process TestCrash_SQLLedger starts.
const (
	childDB    = "SQLPROC_CRASH_DB"
	childInput = "SQLPROC_CRASH_INPUT"
)

func TestMain(m *testing.M) {
	if os.Getenv(childDB) != "" {
		os.Exit(runChild(os.Getenv(childDB), os.Getenv(childInput)))
	}
	os.Exit(m.Run())
}

// runChild runs the SQL ledger over input into the store at db until it
// is killed or told to stop (SIGTERM).
func runChild(db, input string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	s, err := outbox.Open(ctx, outbox.DefaultConfig(db))
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	if err := sqlproc.Guard(ctx, s); err != nil {
		return fail(err)
	}
	cfg, err := readConfig("ledger", "testdata/ledger.yaml")
	if err != nil {
		return fail(err)
	}
	p, err := sqlproc.New(cfg)
	if err != nil {
		return fail(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lcfg := ingest.DefaultConfig("ledger")
	lcfg.Logger = quiet
	lcfg.BatchMax = 200 // many commits, so kills land before, in and after them
	l, err := ingest.NewLoop(s, filefeed.New(input, filefeed.Options{Logger: quiet}), p, lcfg)
	if err != nil {
		return fail(err)
	}
	if err := l.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// TestCrash_SQLLedger kills a process running the SQL ledger with SIGKILL
// at random moments while lines are appended to its file, restarting it
// each time, then checks the result against the Go ledger's on the same
// file: every line's output exactly once, byte for byte, the same dead
// letters and balances. Heavy: run it under the shared lock.
func TestCrash_SQLLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes: not in -short")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	lines := goldenInput(20000, seed)
	var data []byte
	for _, l := range lines {
		data = append(append(data, l...), '\n')
	}
	dir := t.TempDir()
	input, db := dir+"/in.csv", dir+"/sql.db"
	if err := os.WriteFile(input, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	appended := appendInChunks(t, input, data, rng)

	// Kill the child at random moments, giving it more time after a kill
	// that found no progress (a loaded machine, a race-enabled build), up
	// to maxKills; then let the last one finish.
	const maxKills = 25
	kills, midway, stalled := 0, 0, 0
	last := int64(-1)
	for {
		child := startChild(t, db, input)
		if kills == maxKills {
			wait(t, 5*time.Minute, func() error {
				if pos := positionOf(t, db); pos != int64(len(data)) || !isClosed(appended) {
					return fmt.Errorf("position %d of %d", pos, len(data))
				}
				return nil
			})
			child.stop(t)
			break
		}
		window := time.Duration(30+rng.IntN(300)+200*stalled) * time.Millisecond
		select {
		case <-time.After(window):
		case err := <-child.exited:
			t.Fatalf("the child exited by itself: %v\n%s", err, child.stderr())
		}
		pos := positionOf(t, db)
		if pos == int64(len(data)) && isClosed(appended) {
			child.stop(t)
			break
		}
		child.kill(t)
		kills++
		if pos > 0 {
			midway++
		}
		if pos == last {
			stalled++
		} else {
			stalled = 0
		}
		last = pos
	}
	t.Logf("%d kills, %d of them after the first commit", kills, midway)
	if midway < 3 {
		t.Fatalf("%d kills after the first commit: too few to show anything", midway)
	}

	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	goStore := openStore(t, nil)
	goRun := startLoop(t, goStore, "ledger", input, ledger.New("ledger.out"), nil)
	waitApplied(t, goStore, "ledger", int64(len(data)))
	goRun.stop(t)

	goOut, sqlOut := ledgerOutputs(t, goStore), ledgerOutputs(t, s)
	for i := range max(len(goOut), len(sqlOut)) {
		if i >= len(goOut) || i >= len(sqlOut) || !reflect.DeepEqual(goOut[i], sqlOut[i]) {
			t.Fatalf("output %d of %d/%d differs:\n Go:  %s\n SQL: %s", i, len(goOut), len(sqlOut), describe(goOut, i), describe(sqlOut, i))
		}
	}
	if goDead, sqlDead := deadPlaces(t, goStore), deadPlaces(t, s); !reflect.DeepEqual(goDead, sqlDead) {
		t.Fatalf("dead letters differ:\n Go:  %v\n SQL: %v", goDead, sqlDead)
	}
	goBal, err := ledger.Balances(context.Background(), goStore, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if sqlBal := sqlBalances(t, s); !reflect.DeepEqual(goBal, sqlBal) {
		t.Fatalf("balances differ:\n Go:  %v\n SQL: %v", goBal, sqlBal)
	}
	if ic, err := s.IntegrityCheck(context.Background()); err != nil || ic != "ok" {
		t.Fatalf("integrity check: %q, %v", ic, err)
	}
	t.Logf("%d lines, %d outputs, each once", len(lines), len(sqlOut))
}

// appendInChunks appends data to path in chunks of random size, cutting
// lines anywhere, over about two seconds; the channel closes when all is
// written.
func appendInChunks(t *testing.T, path string, data []byte, rng *rand.Rand) <-chan struct{} {
	done := make(chan struct{})
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	rng = rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
	go func() {
		defer close(done)
		defer f.Close()
		for len(data) > 0 {
			n := min(len(data), 1+rng.IntN(16<<10))
			if _, err := f.Write(data[:n]); err != nil {
				t.Error(err)
				return
			}
			data = data[n:]
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return done
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// positionOf reads the feed's stored position in the database at db (0
// when none yet), through a connection of its own.
func positionOf(t *testing.T, db string) int64 {
	t.Helper()
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cps, err := s.ReadPositions(context.Background(), "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if len(cps) == 0 {
		return 0
	}
	return cps[0].Position
}

type child struct {
	cmd    *exec.Cmd
	errOut *os.File
	exited chan error
}

func startChild(t *testing.T, db, input string) *child {
	t.Helper()
	errOut, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDB+"="+db, childInput+"="+input)
	cmd.Stderr = errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, errOut: errOut, exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait() }()
	return c
}

func (c *child) stderr() string {
	b, _ := os.ReadFile(c.errOut.Name())
	return string(b)
}

func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.exited
}

// stop asks the child to finish (SIGTERM) and checks it exits 0.
func (c *child) stop(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.exited:
		if err != nil {
			t.Fatalf("child: %v\n%s", err, c.stderr())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not stop on SIGTERM")
	}
}
