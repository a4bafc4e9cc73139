package tests

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil/pgtest"
)

// TestPostgres_KillNine is TestRelay_KillNine's exactly-once run on the
// PostgreSQL store: the built binary with --db postgres://... (a database
// of its own) applies a ledger file appended to while it is killed (-9)
// at random moments, and relays to a broker. Every line's output is then
// on ledger.out once for a read_committed reader, every malformed line on
// ledger.dlq once, the balances exact in the outputs and in the store, and
// the feed lossless.
func TestPostgres_KillNine(t *testing.T) {
	db := pgtest.New(t).DSN
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 25))
	lf := makeLedger(rng, 50_000)
	broker := startBroker(t)
	input := t.TempDir() + "/ledger.csv"
	args := []string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--http", "127.0.0.1:0", "--brokers", broker}
	writing := appendSlowly(t, input, lf.data, 6*time.Second, rng)
	const kills = 12
	moved, last := 0, int64(-1)
	for range kills {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(100+rng.IntN(500)) * time.Millisecond) // a random moment to crash at
		p.kill()
		if pos := storedPosition(t, db, "ledger"); pos > last {
			moved, last = moved+1, pos
		}
	}
	<-writing
	// The kills must land in the middle of the work, not all before the
	// server got going.
	if moved < 2 {
		t.Fatalf("the stored position moved between only %d of %d kills", moved, kills)
	}
	t.Logf("%d of %d kills after the position moved (last %d of %d bytes)", moved, kills, last, len(lf.data))
	p := start(t, nil, args...)
	waitPublished(t, db, int64(len(lf.data)))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	checkTopics(t, broker, lf, 0)
	checkLedger(t, db, lf, 0)
	checkRunningBalances(t, db)
}

// TestPostgres_QueryCheckedAtStart: a state query's SQL is checked at
// start against the PostgreSQL store it will run on (prepared there): one
// PostgreSQL refuses stops the start in one line, exit 2.
func TestPostgres_QueryCheckedAtStart(t *testing.T) {
	db := pgtest.New(t)
	cfg := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(cfg, []byte("queries:\n  n: SELECT count(*) AS n FRM feeds\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(serverBin, "--config", cfg, "--db", db.DSN, "--relay", "none")
	out, _ := cmd.CombinedOutput()
	// Its last line (warnings come first).
	want := "\nserver: queries.n: ERROR: syntax error at or near \"FRM\" (SQLSTATE 42601)\n"
	if cmd.ProcessState.ExitCode() != 2 || !strings.HasSuffix(string(out), want) {
		t.Fatalf("exit %d, %q; want 2, %q", cmd.ProcessState.ExitCode(), out, want)
	}
}

// TestPostgres_RefusesRecording: a recorded feed on --db postgres:// is
// refused at start in one line saying why (exit 2), nothing created.
func TestPostgres_RefusesRecording(t *testing.T) {
	db := pgtest.New(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "in.csv")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(serverBin, "--db", db.DSN, "--relay", "none", "--feed", "f=file:"+file,
		"--processor", "f=forward", "--topic", "f=t", "--record", "f="+filepath.Join(dir, "rec"))
	out, _ := cmd.CombinedOutput()
	want := "\nserver: --record f: a recording starts from a SQLite snapshot of the database and replays into a SQLite file: " +
		"record on a SQLite --db, not on --db postgres://\n"
	if cmd.ProcessState.ExitCode() != 2 || !strings.HasSuffix("\n"+string(out), want) {
		t.Fatalf("exit %d, %q; want 2, %q", cmd.ProcessState.ExitCode(), out, want)
	}
	var tables int
	if err := db.Conn(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("the refused start made %d tables", tables)
	}
}
