package tests

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// Exit codes README and docs/guarantees.md document.
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
	exitFenced = 3
)

// launch starts the server as start does, optionally as another user
// (cred), and returns a channel closed as soon as its log first contains
// marker (never, for an empty marker).
func launch(t *testing.T, cred *syscall.Credential, marker string, env []string, args ...string) (*proc, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(serverBin, args...)
	cmd.Env = append(os.Environ(), env...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	p := &proc{cmd: cmd, log: &syncBuffer{}, done: make(chan struct{})}
	w := &markWriter{w: p.log, marker: marker, seen: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("server log (pid %d):\n%s", cmd.Process.Pid, tail(p.log.String(), 3000))
		}
	})
	return p, w.seen
}

// markWriter closes seen at the first write that contains marker. The
// server's logger writes each line with one Write.
type markWriter struct {
	w      *syncBuffer
	marker string
	once   sync.Once
	seen   chan struct{}
}

func (m *markWriter) Write(b []byte) (int, error) {
	n, err := m.w.Write(b)
	if m.marker != "" && strings.Contains(string(b), m.marker) {
		m.once.Do(func() { close(m.seen) })
	}
	return n, err
}

// waitExit waits for the server to exit and returns its exit code; a
// process ended by a signal fails the test.
func waitExit(t *testing.T, p *proc, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("the server did not exit within %v", timeout)
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("the server was killed by %v: it must exit by itself", ws.Signal())
	}
	return p.cmd.ProcessState.ExitCode()
}

// exited reports whether the server has exited.
func exited(p *proc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// oneLine returns the server's output, which must be exactly one line.
func oneLine(t *testing.T, p *proc) string {
	t.Helper()
	out := strings.TrimSuffix(p.log.String(), "\n")
	if out == "" || strings.Contains(out, "\n") {
		t.Fatalf("output %q: want exactly one line", p.log.String())
	}
	return out
}

var closestRE = regexp.MustCompile(`closest=OUTBOXD_BATCH_MAX(\s|$)`)

var listeningRE = regexp.MustCompile(`HTTP API listening.* addr=(\S+)`)

// apiBase waits for the server's HTTP API and returns its base URL.
func apiBase(t *testing.T, p *proc) string {
	t.Helper()
	var base string
	wait(t, 30*time.Second, func() error {
		if m := listeningRE.FindStringSubmatch(p.log.String()); m != nil {
			base = "http://" + m[1]
			return nil
		}
		if exited(p) {
			t.Fatalf("the server exited before its API listened")
		}
		return errors.New("the API is not listening yet")
	})
	return base
}

// alive fails the test unless the server is running and answers /healthz.
func alive(t *testing.T, p *proc, base string) {
	t.Helper()
	if exited(p) {
		t.Fatalf("the server exited (code %d); it must keep running", p.cmd.ProcessState.ExitCode())
	}
	res, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %s", res.Status)
	}
}

// published says whether the feed has stored position end and the relay
// published every outbox row. It opens the database and closes it again:
// a handle left open on a database that a test then deletes would, at its
// close, remove the -wal file of whatever database is at the path by then.
func published(db string, end int64) error {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(db))
	if err != nil {
		return err
	}
	defer s.Close()
	cps, err := s.ReadPositions(ctx, "ledger")
	if err != nil || len(cps) == 0 || cps[0].Position != end {
		return fmt.Errorf("stored position %v (%v), want %d", cps, err, end)
	}
	return relayDone(ctx, s)
}

// ledgerWithDeadLetters is makeLedger(rng, n) with at least one malformed
// line, so that the dead-letter topic exists for checkTopics.
func ledgerWithDeadLetters(rng *rand.Rand, n int) ledgerFile {
	for {
		if lf := makeLedger(rng, n); len(lf.malformed) > 0 {
			return lf
		}
	}
}

// chunks cuts data at line ends into n pieces of about the same size.
func chunks(data []byte, n int) [][]byte {
	var out [][]byte
	for i := n; i > 0; i-- {
		cut := len(data) / i
		if i > 1 {
			cut = strings.IndexByte(string(data[cut:]), '\n') + cut + 1
		} else {
			cut = len(data)
		}
		out = append(out, data[:cut])
		data = data[cut:]
	}
	return out
}

// ledgerArgs are the arguments of a ledger server on db and input.
func ledgerArgs(db, input string, extra ...string) []string {
	return append([]string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger"}, extra...)
}

// removeDatabase removes the database file and its -wal and -shm files,
// as `rm outboxd.db*` does.
func removeDatabase(t *testing.T, db string) {
	t.Helper()
	for _, suf := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(db + suf); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
}

// checkTopicsTwice checks ledger.out and ledger.dlq hold exactly two
// records per line: a database started afresh publishes everything again.
func checkTopicsTwice(t *testing.T, broker string, lf ledgerFile) {
	t.Helper()
	got := readAll(t, broker, "ledger.out", "ledger.dlq")
	for topic, want := range map[string][]int64{"ledger.out": lf.valid, "ledger.dlq": lf.malformed} {
		var pos []int64
		for _, c := range got[topic] {
			pos = append(pos, atoi64(c.Headers["outboxd-position"]))
		}
		twice := append(append([]int64{}, want...), want...)
		slices.Sort(twice)
		checkPositions(t, topic, pos, twice)
	}
}

// TestLifecycle_DatabaseDeleted deletes the database under a running
// server: the server must stop with a clear error and leave a copy of the
// database; a restart on the new empty database must refuse to publish the
// outputs again; the copy, restored, goes on exactly once; and only
// --new-database starts afresh (publishing everything again).
func TestLifecycle_DatabaseDeleted(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	broker := startBroker(t)
	dir := t.TempDir()
	input, db := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "outboxd.db")
	lf := ledgerWithDeadLetters(rng, 3000)
	if err := os.WriteFile(input, lf.data, 0o644); err != nil {
		t.Fatal(err)
	}
	args := ledgerArgs(db, input, "--brokers", broker, "--http", "127.0.0.1:0")
	end := int64(len(lf.data))
	refuses := func(t *testing.T, want ...string) string {
		t.Helper()
		p := start(t, nil, args...)
		if code := waitExit(t, p, 60*time.Second); code != exitConfig {
			t.Fatalf("exit code %d on a new database beside an earlier one's progress, want %d", code, exitConfig)
		}
		line := oneLine(t, p)
		for _, want := range append([]string{db, "--new-database", "published"}, want...) {
			if !strings.Contains(line, want) {
				t.Fatalf("message %q does not name %q", line, want)
			}
		}
		return line
	}

	p := start(t, nil, args...)
	wait(t, 60*time.Second, func() error { return published(db, end) })
	removeDatabase(t, db)
	if code := waitExit(t, p, 20*time.Second); code != exitFailed {
		t.Fatalf("exit code %d after the database was deleted, want %d", code, exitFailed)
	}
	copies, _ := filepath.Glob(db + ".rescued-*")
	if len(copies) != 1 {
		t.Fatalf("copies of the deleted database: %v, want one", copies)
	}
	restore := "mv " + copies[0] + " " + db
	for _, want := range []string{db + " was deleted", "saved at " + copies[0], "run: " + restore} {
		if !strings.Contains(p.log.String(), want) {
			t.Fatalf("the log does not say %q", want)
		}
	}
	checkTopics(t, broker, lf, 0)

	var command string
	t.Run("RestartRefuses", func(t *testing.T) {
		// A supervisor starts it again: the refusal names the rescued copy
		// and the command that goes on from it.
		line := refuses(t, copies[0])
		if m := regexp.MustCompile(`run: (.*) \(it replaces`).FindStringSubmatch(line); m != nil {
			command = m[1]
		}
		if command != restore {
			t.Fatalf("the refusal's command is %q, want %q: %s", command, restore, line)
		}
		refuses(t, copies[0]) // the refused start left a new database behind: it must refuse again
		checkTopics(t, broker, lf, 0)
	})

	more := makeLedger(rng, 50)
	for _, v := range more.valid {
		lf.valid = append(lf.valid, end+v)
	}
	for _, m := range more.malformed {
		lf.malformed = append(lf.malformed, end+m)
	}
	for a, b := range more.balances {
		lf.balances[a] += b
	}
	lf.data = append(lf.data, more.data...)
	end = int64(len(lf.data))

	t.Run("CopyRestored", func(t *testing.T) {
		// The refusal's command, as an operator runs it.
		if out, err := exec.Command("sh", "-c", command).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", command, err, out)
		}
		p := start(t, nil, args...)
		appendFile(t, input, string(more.data))
		wait(t, 60*time.Second, func() error { return published(db, end) })
		if code := p.stop(t, 30*time.Second); code != exitOK {
			t.Fatalf("exit code %d, want 0", code)
		}
		checkTopics(t, broker, lf, 0)
		checkLedger(t, db, lf, 0)
	})

	t.Run("DeletedWhileStopped", func(t *testing.T) {
		removeDatabase(t, db)
		refuses(t)
		p := start(t, nil, append(args, "--new-database")...)
		wait(t, 60*time.Second, func() error { return published(db, end) })
		if code := p.stop(t, 30*time.Second); code != exitOK {
			t.Fatalf("exit code %d with --new-database, want 0", code)
		}
		checkTopicsTwice(t, broker, lf)
		// The choice is recorded: a start without the flag runs.
		p = start(t, nil, args...)
		if code := p.stop(t, 30*time.Second); code != exitOK {
			t.Fatalf("exit code %d, want 0", code)
		}
		checkTopicsTwice(t, broker, lf)
	})
}

// TestLifecycle_DatabaseReplaced moves another database over the path of a
// running server's: it must stop with a clear error, and a restart on the
// other, never-published database must refuse to publish.
func TestLifecycle_DatabaseReplaced(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 29))
	broker := startBroker(t)
	dir := t.TempDir()
	input, db := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "outboxd.db")
	lf := ledgerWithDeadLetters(rng, 2000)
	if err := os.WriteFile(input, lf.data, 0o644); err != nil {
		t.Fatal(err)
	}
	args := ledgerArgs(db, input, "--brokers", broker, "--http", "127.0.0.1:0")
	p := start(t, nil, args...)
	wait(t, 60*time.Second, func() error { return published(db, int64(len(lf.data))) })

	other := filepath.Join(dir, "other.db")
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(other))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, db); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, p, 20*time.Second); code != exitFailed {
		t.Fatalf("exit code %d after the database was replaced, want %d", code, exitFailed)
	}
	if want := db + " was replaced by another file"; !strings.Contains(p.log.String(), want) {
		t.Fatalf("the log does not say %q", want)
	}
	if copies, _ := filepath.Glob(db + ".rescued-*"); len(copies) != 1 || published(copies[0], int64(len(lf.data))) != nil {
		t.Fatalf("copies of the replaced database: %v, want one that holds everything", copies)
	}

	p = start(t, nil, args...)
	if code := waitExit(t, p, 60*time.Second); code != exitConfig {
		t.Fatalf("exit code %d on the other database, want %d", code, exitConfig)
	}
	if line := oneLine(t, p); !strings.Contains(line, "--new-database") {
		t.Fatalf("message %q does not name --new-database", line)
	}
	checkTopics(t, broker, lf, 0)
}

// TestLifecycle_TwoAtOnce starts two servers on the same database at the
// same moment, round after round: exactly one must keep running and
// publishing, the other exit with the documented code and message, and
// every output stay exactly once.
func TestLifecycle_TwoAtOnce(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 31))
	broker := startBroker(t)
	dir := t.TempDir()
	input, db := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "outboxd.db")
	const rounds = 20
	lf := ledgerWithDeadLetters(rng, rounds*200)
	parts := chunks(lf.data, 2*rounds)
	if err := os.WriteFile(input, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	args := ledgerArgs(db, input, "--brokers", broker, "--http", "127.0.0.1:0")
	var end int64
	how := map[string]int{} // what told each loser it had lost
	for round := range rounds {
		appendFile(t, input, string(parts[2*round]))
		end += int64(len(parts[2*round]))
		a, b := start(t, nil, args...), start(t, nil, args...)
		var loser, winner *proc
		select {
		case <-a.done:
			loser, winner = a, b
		case <-b.done:
			loser, winner = b, a
		case <-time.After(60 * time.Second):
			t.Fatalf("round %d: both servers still run a minute after they started on one database", round)
		}
		if code := waitExit(t, loser, time.Second); code != exitFenced {
			t.Fatalf("round %d: the loser's exit code %d, want %d", round, code, exitFenced)
		}
		if msg := "another outboxd process has claimed this database"; !strings.Contains(loser.log.String(), msg) {
			t.Fatalf("round %d: the loser's log does not say %q", round, msg)
		}
		how[lostBy(loser.log.String())]++
		// The winner goes on: it publishes what comes after the loser left.
		appendFile(t, input, string(parts[2*round+1]))
		end += int64(len(parts[2*round+1]))
		wait(t, 60*time.Second, func() error {
			if exited(winner) {
				t.Fatalf("round %d: the winner exited too (code %d)", round, winner.cmd.ProcessState.ExitCode())
			}
			return published(db, end)
		})
		alive(t, winner, apiBase(t, winner))
		if code := winner.stop(t, 30*time.Second); code != exitOK {
			t.Fatalf("round %d: the winner's exit code %d after SIGTERM, want 0", round, code)
		}
	}
	t.Logf("the losers learnt it from: %v", how)
	checkTopics(t, broker, lf, 0)
	checkLedger(t, db, lf, 0)
}

// lostBy says what told a server it lost its database: a feed's commit,
// the relay, or the watchdog.
func lostBy(log string) string {
	i := strings.Index(log, "another server took over this database")
	if i < 0 {
		return "?"
	}
	line := log[i:]
	switch {
	case strings.Contains(line, `err="feed `):
		return "feed commit"
	case strings.Contains(line, `err="relay`):
		return "relay"
	default:
		return "watchdog"
	}
}

// runAsOther returns credentials under which a file mode denies access
// (root reads anything): nobody's when the test runs as root, nil (this
// user) otherwise. Paths it must reach are made reachable by the caller.
func runAsOther() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: 65534, Gid: 65534}
}

// openDir makes a directory every user can enter and read, outside the
// test's private temporary directory.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "outboxd-lifecycle")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startFailure is a mistaken start: its arguments (after the running
// server's own), the user it runs as, and what its one line must say.
type startFailure struct {
	name string
	args []string
	cred *syscall.Credential
	want string
}

// TestLifecycle_FailedStartBeside starts, beside a running server, servers
// on the same database that cannot run (a port in use, a directory or an
// unreadable file as the input, a bad address): each must exit 2 with one
// line, and the running server keep running and applying, exactly once.
func TestLifecycle_FailedStartBeside(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 37))
	dir := openDir(t)
	input, db := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "outboxd.db")
	lf := ledgerWithDeadLetters(rng, 1000)
	if err := os.WriteFile(input, lf.data, 0o644); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "unreadable.csv")
	if err := os.WriteFile(unreadable, []byte("acct-1,1\n"), 0o000); err != nil {
		t.Fatal(err)
	}
	httpAddr, devAddr := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	running := start(t, nil, ledgerArgs(db, input, "--http", httpAddr, "--dev-broker-addr", devAddr)...)
	end := int64(len(lf.data))
	wait(t, 60*time.Second, func() error { return published(db, end) })

	other := "127.0.0.1:" + freePort(t)
	for _, tc := range []startFailure{
		{"PortInUse", []string{"--http", httpAddr, "--dev-broker-addr", other}, nil, "--http " + httpAddr},
		{"DevBrokerPortInUse", []string{"--http", "127.0.0.1:0", "--dev-broker-addr", devAddr}, nil, "--dev-broker-addr " + devAddr},
		{"DirectoryAsInput", []string{"--http", "127.0.0.1:0", "--dev-broker-addr", other, "--feed", "ledger=file:" + dir}, nil,
			dir + ": is a directory"},
		{"UnreadableInput", []string{"--http", "127.0.0.1:0", "--dev-broker-addr", other, "--feed", "ledger=file:" + unreadable},
			runAsOther(), unreadable},
		{"BadPort", []string{"--http", "127.0.0.1:99999", "--dev-broker-addr", other}, nil, "--http"},
		{"BadAddress", []string{"--http", "nowhere", "--dev-broker-addr", other}, nil, "--http"},
		{"BadBrokerAddress", []string{"--http", "127.0.0.1:0", "--brokers", "kafka-1"}, nil, "--brokers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := ledgerArgs(db, input)
			if i := slices.Index(tc.args, "--feed"); i >= 0 {
				args[3] = tc.args[i+1] // another source for the running server's feed
				tc.args = slices.Delete(slices.Clone(tc.args), i, i+2)
			}
			p, _ := launch(t, tc.cred, "", nil, append(args, tc.args...)...)
			if code := waitExit(t, p, 30*time.Second); code != exitConfig {
				t.Fatalf("exit code %d, want %d", code, exitConfig)
			}
			if line := oneLine(t, p); !strings.HasPrefix(line, "server: ") || !strings.Contains(line, tc.want) {
				t.Fatalf("message %q: want one line naming %q", line, tc.want)
			}
			// The running server was not disturbed: it applies and
			// publishes a line appended now, once.
			more := makeLedger(rng, 3)
			appendFile(t, input, string(more.data))
			lf.data = append(lf.data, more.data...)
			for _, v := range more.valid {
				lf.valid = append(lf.valid, end+v)
			}
			for _, m := range more.malformed {
				lf.malformed = append(lf.malformed, end+m)
			}
			for a, b := range more.balances {
				lf.balances[a] += b
			}
			end += int64(len(more.data))
			wait(t, 30*time.Second, func() error {
				if exited(running) {
					t.Fatalf("the running server exited (code %d) after the failed start", running.cmd.ProcessState.ExitCode())
				}
				return published(db, end)
			})
		})
	}
	alive(t, running, "http://"+httpAddr)
	checkTopics(t, devAddr, lf, 0) // the dev broker lives in the running server
	if code := running.stop(t, 30*time.Second); code != exitOK {
		t.Fatalf("exit code %d, want 0", code)
	}
	checkLedger(t, db, lf, 0)
}

// TestLifecycle_SigtermWhileStarting sends SIGTERM at a random moment from
// 0 to 50 ms after the server's first log line (written right after it
// read its configuration), round after round: while it checks its
// configuration, opens and claims the database, starts the feeds and the
// relay, or runs. Every time it must exit 0, never be killed by the signal;
// and in the end every line is applied and published exactly once. (A
// signal before that line, from the binary's first initialiser on, is
// caught the same way: TestCommandSignals_SignalFirst in server.)
func TestLifecycle_SigtermWhileStarting(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 41))
	const rounds = 60
	lf := ledgerWithDeadLetters(rng, rounds*50)
	parts := chunks(lf.data, rounds)

	run := func(t *testing.T, args []string, each func(round int)) {
		var at []time.Duration
		phases := map[string]int{} // how far each server had come when it stopped
		for round := range rounds {
			each(round)
			p, first := launch(t, nil, "outboxd starting", nil, append(args, "--log-level", "debug")...)
			select {
			case <-first:
			case <-p.done:
				t.Fatalf("round %d: the server exited before its first log line: %s", round, p.log.String())
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: no first log line within 30s", round)
			}
			// From 0 to 50 ms, most of them early: on an idle machine the
			// server runs a few milliseconds after its first line.
			u := rng.Float64()
			d := time.Duration(u * u * u * float64(50*time.Millisecond))
			at = append(at, d)
			time.Sleep(d) // the random moment itself
			p.cmd.Process.Signal(syscall.SIGTERM)
			if code := waitExit(t, p, 30*time.Second); code != exitOK {
				t.Fatalf("round %d: exit code %d after SIGTERM %v after start, want 0", round, code, d)
			}
			phases[startPhase(p.log.String())]++
		}
		slices.Sort(at)
		t.Logf("%d SIGTERMs %v to %v after the first log line; stopped %v", rounds, at[0], at[len(at)-1], phases)
	}

	t.Run("Broker", func(t *testing.T) {
		broker := startBroker(t)
		dir := t.TempDir()
		input, db := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "outboxd.db")
		if err := os.WriteFile(input, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		args := ledgerArgs(db, input, "--brokers", broker, "--http", "127.0.0.1:0")
		run(t, args, func(round int) { appendFile(t, input, string(parts[round])) })
		p := start(t, nil, args...)
		wait(t, 60*time.Second, func() error { return published(db, int64(len(lf.data))) })
		if code := p.stop(t, 30*time.Second); code != exitOK {
			t.Fatalf("exit code %d, want 0", code)
		}
		checkTopics(t, broker, lf, 0)
		checkLedger(t, db, lf, 0)
	})

	t.Run("DevBroker", func(t *testing.T) {
		dir := t.TempDir()
		input := filepath.Join(dir, "ledger.csv")
		if err := os.WriteFile(input, lf.data, 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, ledgerArgs(filepath.Join(dir, "outboxd.db"), input, "--http", "127.0.0.1:0", "--dev-broker-addr", "127.0.0.1:0"),
			func(int) {})
	})
}

// startPhase says how far a server had come in its start when it stopped.
func startPhase(log string) string {
	switch {
	case strings.Contains(log, "outboxd running"):
		return "running"
	case strings.Contains(log, "database claimed"):
		return "claimed, starting the API, feeds and relay"
	default:
		return "before the claim"
	}
}

// TestLifecycle_ConfigMistakes runs the server with one mistake each:
// every one must exit 2 with one line naming it, and create nothing.
func TestLifecycle_ConfigMistakes(t *testing.T) {
	dir := openDir(t)
	input := filepath.Join(dir, "ledger.csv")
	if err := os.WriteFile(input, []byte("acct-1,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "unreadable.csv")
	if err := os.WriteFile(unreadable, []byte("acct-1,1\n"), 0o000); err != nil {
		t.Fatal(err)
	}
	locked := filepath.Join(dir, "locked")
	if err := os.Mkdir(locked, 0o555); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "data", "outboxd.db")
	base := []string{"--db", db, "--http", "127.0.0.1:0", "--relay", "none"}
	for _, tc := range []struct {
		startFailure
		env []string
	}{
		{startFailure: startFailure{"DirectoryAsInput", []string{"--feed", "a=file:" + dir}, nil, dir + ": is a directory"}},
		{startFailure: startFailure{"UnreadableInput", []string{"--feed", "a=file:" + unreadable}, runAsOther(), unreadable}},
		{startFailure: startFailure{"DatabaseDirectoryNotWritable",
			[]string{"--feed", "a=file:" + input, "--db", filepath.Join(locked, "outboxd.db")}, runAsOther(), locked}},
		{startFailure: startFailure{"DatabaseIsADirectory", []string{"--feed", "a=file:" + input, "--db", dir}, nil, dir + " is a directory"}},
		{startFailure: startFailure{"FeedTwice", []string{"--feed", "a=file:" + input, "--feed", "a=file:" + unreadable}, nil,
			"feed a: --feed given twice"}},
		{startFailure: startFailure{"ProcessorTwice", []string{"--feed", "a=file:" + input, "--processor", "a=ledger", "--processor", "a=forward"},
			nil, "feed a: --processor given twice"}},
		{startFailure: startFailure{"FeedTwiceInEnv", nil, nil, "feed a: --feed given twice"},
			env: []string{"OUTBOXD_FEED=a=file:" + input + ",a=file:" + unreadable}},
		{startFailure: startFailure{"BadHTTPAddress", []string{"--feed", "a=file:" + input, "--http", "localhost"}, nil, "--http"}},
		{startFailure: startFailure{"BadBroker", []string{"--feed", "a=file:" + input, "--relay", "exactly-once", "--brokers", "kafka-1:x"}, nil,
			"--brokers"}},
		{startFailure: startFailure{"BadDevBrokerAddress", []string{"--feed", "a=file:" + input, "--relay", "exactly-once",
			"--dev-broker-addr", "nowhere"}, nil, "--dev-broker-addr"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := launch(t, tc.cred, "", tc.env, append(base, tc.args...)...)
			if code := waitExit(t, p, 30*time.Second); code != exitConfig {
				t.Fatalf("exit code %d, want %d", code, exitConfig)
			}
			if line := oneLine(t, p); !strings.HasPrefix(line, "server: ") || !strings.Contains(line, tc.want) {
				t.Fatalf("message %q: want one line naming %q", line, tc.want)
			}
			if _, err := os.Stat(filepath.Dir(db)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a start that failed its checks created %s (%v)", filepath.Dir(db), err)
			}
		})
	}

	t.Run("UnknownVariableWarns", func(t *testing.T) {
		p := start(t, []string{"OUTBOXD_BATCH_MAXX=10"}, append(base, "--feed", "a=file:"+input)...)
		wait(t, 30*time.Second, func() error {
			if !strings.Contains(p.log.String(), "outboxd running") {
				return errors.New("not running yet")
			}
			return nil
		})
		if code := p.stop(t, 30*time.Second); code != exitOK {
			t.Fatalf("exit code %d, want 0", code)
		}
		var warned []string
		for _, l := range strings.Split(p.log.String(), "\n") {
			if strings.Contains(l, "OUTBOXD_BATCH_MAXX") {
				warned = append(warned, l)
			}
		}
		if len(warned) != 1 || !strings.Contains(warned[0], "level=WARN") || !closestRE.MatchString(warned[0]) {
			t.Fatalf("lines naming OUTBOXD_BATCH_MAXX: %q; want one warning naming OUTBOXD_BATCH_MAX", warned)
		}
	})
}

// TestLifecycle_ProcessorChanged starts a ledger feed's database under
// another processor: the start is refused with one line and exit code 2,
// the database untouched, until --on-processor-change says what to do.
// restart reads the file again from the beginning into the new
// processor's state (balances right); keep keeps the position and state;
// each is recorded once, so the next start is quiet. A SQL processor
// whose statements change is another processor; a database that never
// recorded its feeds' processor adopts the one of the same name, saying
// so once.
func TestLifecycle_ProcessorChanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 31))
	dir := t.TempDir()
	input, db := filepath.Join(t.TempDir(), "ledger.csv"), filepath.Join(dir, "outboxd.db")
	lf := ledgerWithDeadLetters(rng, 2000)
	if err := os.WriteFile(input, lf.data, 0o644); err != nil {
		t.Fatal(err)
	}
	end := int64(len(lf.data))
	common := []string{"--config", example("ledger.yaml"), "--db", db, "--feed", "ledger=file:" + input,
		"--relay", "none", "--http", "127.0.0.1:0"}
	goLedger := append(slices.Clone(common), "--processor", "ledger=ledger")
	sqlLedger := common // examples/ledger.yaml's sql-ledger
	// run runs a server with args until it has applied the whole file
	// (the feed at its end with applied items in all) and stops it.
	var applied func(t *testing.T) int64
	run := func(t *testing.T, all int64, args ...string) *proc {
		t.Helper()
		p := start(t, nil, args...)
		waitRunning(t, p)
		wait(t, 60*time.Second, func() error {
			if pos, n := storedPosition(t, db, "ledger"), applied(t); pos != end || n != all {
				return fmt.Errorf("stored position %d, applied %d; want %d, %d", pos, n, end, all)
			}
			return nil
		})
		if code := p.stop(t, 30*time.Second); code != exitOK {
			t.Fatalf("exit code %d, want 0", code)
		}
		return p
	}
	applied = func(t *testing.T) int64 {
		t.Helper()
		s := readStore(t, db)
		f, err := s.Feed(context.Background(), "ledger")
		if err != nil {
			t.Fatal(err)
		}
		return f.Applied
	}
	refused := func(t *testing.T, was, now string, args ...string) {
		t.Helper()
		before := applied(t)
		p := start(t, nil, args...)
		if code := waitExit(t, p, 30*time.Second); code != exitConfig {
			t.Fatalf("exit code %d, want %d", code, exitConfig)
		}
		line := oneLine(t, p)
		for _, want := range []string{"feed ledger: its state was made by processor " + was, "this start gives it " + now,
			"--on-processor-change ledger=restart", "ledger=keep"} {
			if !strings.Contains(line, want) {
				t.Fatalf("message %q does not say %q", line, want)
			}
		}
		if pos, n := storedPosition(t, db, "ledger"), applied(t); pos != end || n != before {
			t.Fatalf("the refused start changed the feed: position %d, applied %d; want %d, %d", pos, n, end, before)
		}
	}
	quiet := func(t *testing.T, p *proc) {
		t.Helper()
		for _, s := range []string{"--on-processor-change", "did not record the feed's processor"} {
			if n := logged(p, s); n != 0 {
				t.Fatalf("%d log lines %q on a start with the recorded processor:\n%s", n, s, tail(p.log.String(), 2000))
			}
		}
	}

	once, twice := int64(len(lf.valid)), 2*int64(len(lf.valid))
	quiet(t, run(t, once, goLedger...))
	checkLedger(t, db, lf, 0)

	t.Run("Restart", func(t *testing.T) {
		refused(t, "ledger", "sql-ledger (sql (fingerprint ", sqlLedger...)
		p := run(t, twice, append(slices.Clone(sqlLedger), "--on-processor-change", "ledger=restart")...)
		if n := logged(p, "the feed starts over from the beginning of its source"); n != 1 {
			t.Fatalf("%d log lines saying the feed starts over, want 1", n)
		}
		s := readStore(t, db)
		if got := sqlLedgerBalances(t, s); !equalBalances(got, lf.balances) {
			t.Fatalf("SQL balances after the restart differ from the file's sums:\n got %v\nwant %v", got, lf.balances)
		}
		// Every item applied again, once.
		if n, want := applied(t), 2*int64(len(lf.valid)); n != want {
			t.Fatalf("applied %d, want %d: each valid line once per processor", n, want)
		}
		quiet(t, run(t, twice, sqlLedger...)) // recorded: the next start is quiet
		if n, want := applied(t), 2*int64(len(lf.valid)); n != want {
			t.Fatalf("applied %d after a quiet start, want %d", n, want)
		}
	})

	t.Run("StatementsChanged", func(t *testing.T) {
		b, err := os.ReadFile(example("ledger.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		doubled := strings.Replace(string(b), "balance = balance + excluded.balance", "balance = balance + 2 * excluded.balance", 1)
		if doubled == string(b) {
			t.Fatal("examples/ledger.yaml's apply is not the one this test changes")
		}
		yaml := filepath.Join(t.TempDir(), "doubled.yaml")
		if err := os.WriteFile(yaml, []byte(doubled), 0o644); err != nil {
			t.Fatal(err)
		}
		args := slices.Clone(sqlLedger)
		args[1] = yaml
		refused(t, "sql-ledger (sql (fingerprint ", "sql-ledger (sql (fingerprint ", args...)
	})

	t.Run("Keep", func(t *testing.T) {
		refused(t, "sql-ledger (sql (fingerprint ", "ledger", goLedger...)
		before := applied(t)
		p := run(t, twice, append(slices.Clone(goLedger), "--on-processor-change", "ledger=keep")...)
		if n := logged(p, "its position and state are kept for the new processor"); n != 1 {
			t.Fatalf("%d log lines saying the state is kept, want 1", n)
		}
		if n := applied(t); n != before {
			t.Fatalf("applied %d after keep, want %d: nothing applied again", n, before)
		}
		quiet(t, run(t, twice, goLedger...))
	})

	t.Run("Adopted", func(t *testing.T) {
		// A database from before feeds' processors were recorded.
		s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
		if err != nil {
			t.Fatal(err)
		}
		_, err = outboxtest.Exec(context.Background(), s, `DELETE FROM feed_processors`)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		refused(t, "ledger", "sql-ledger (sql (fingerprint ", sqlLedger...) // another name: a change
		p := run(t, twice, goLedger...)
		if n := logged(p, "did not record the feed's processor"); n != 1 {
			t.Fatalf("%d log lines saying the processor is adopted, want 1:\n%s", n, tail(p.log.String(), 2000))
		}
		quiet(t, run(t, twice, goLedger...))
		refused(t, "ledger", "sql-ledger (sql (fingerprint ", sqlLedger...)
	})
}
