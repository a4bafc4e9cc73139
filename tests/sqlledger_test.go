package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// trickyLedgerLines are lines the Go ledger reads in ways a SQL ledger
// could miss: white space, signs, leading zeros, quotes, characters JSON
// escapes, text that is not UTF-8, and malformed lines of every kind.
var trickyLedgerLines = []string{
	" a , -5 ", "\ta\t,\t7", "a,+7", "a,-0", "007,1", "+5,1", `"q",1`, `"x, y",2`, "café ☕ Ωmega ,3",
	"<b>&amp;</b>,1", "line\u2028sep\u2029para,2", `back\slash "q",5`,
	"\xff\xfe,1", "acct,\xff1", "", "no comma here", ",5", "   ,5", "a,", "a,12z", "a,1.5", "a,0x10",
	"a,1_000", "a,+-1", "a,1,2", "a,１２",
}

// makeTrickyLedger is makeLedger's input with the tricky lines spread
// through it.
func makeTrickyLedger(rng *rand.Rand, n int) ledgerFile {
	plain := makeLedger(rng, n)
	lines := strings.SplitAfter(string(plain.data), "\n")
	lf := ledgerFile{balances: map[string]int64{}}
	var b strings.Builder
	for _, line := range lines {
		if line == "" {
			continue
		}
		if rng.IntN(200) == 0 {
			line = trickyLedgerLines[rng.IntN(len(trickyLedgerLines))] + "\n"
		}
		b.WriteString(line)
		pos := int64(b.Len())
		if e, err := ledger.Parse([]byte(strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"))); err == nil {
			lf.valid = append(lf.valid, pos)
			lf.balances[e.Account] += e.Amount
		} else {
			lf.malformed = append(lf.malformed, pos)
		}
	}
	lf.data = []byte(b.String())
	return lf
}

// ledgerOutputs lists the rows of ledger.out as "position/n key value
// headers", in id order.
func ledgerOutputs(t *testing.T, s *outbox.Store) []string {
	t.Helper()
	var out []string
	for _, r := range allRows(t, s) {
		if r.Topic == "ledger.out" {
			out = append(out, fmt.Sprintf("%d/%d %q %q %q", r.Position, r.N, r.Key, r.Value, r.Headers))
		}
	}
	return out
}

// sqlLedgerBalances reads examples/ledger.yaml's balances table.
func sqlLedgerBalances(t *testing.T, s *outbox.Store) map[string]int64 {
	t.Helper()
	m, err := outboxtest.Balances(context.Background(), s, "balances")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSQLLedger_GoldenKillNine runs the Go ledger and the SQL ledger of
// examples/ledger.yaml, each a server of its own on its own database, on
// the same file while it is appended to, killing each with SIGKILL at
// random moments. Then each catches up: the SQL ledger's outputs (key,
// value and headers at every position), dead letters (position and
// reason), counters and balances are exactly the Go ledger's, and the Go
// ledger's are exactly the file's.
func TestSQLLedger_GoldenKillNine(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 17))
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	goDB, sqlDB := filepath.Join(dir, "go.db"), filepath.Join(dir, "sql.db")
	lf := makeTrickyLedger(rng, 60_000)
	common := []string{"--feed", "ledger=file:" + input, "--relay", "none", "--http", "127.0.0.1:0"}
	goArgs := append([]string{"--db", goDB, "--processor", "ledger=ledger"}, common...)
	sqlArgs := append([]string{"--config", example("ledger.yaml"), "--db", sqlDB}, common...)

	t0 := time.Now()
	writing := appendSlowly(t, input, lf.data, 6*time.Second, rng)
	kills := 0
	for kills < 24 {
		args := goArgs
		if kills%2 == 1 {
			args = sqlArgs
		}
		p := start(t, nil, args...)
		time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond) // a random moment to crash at
		p.kill()
		kills++
	}
	<-writing
	t.Logf("%d kill -9s, half of each server, while %d bytes were appended (%v)", kills, len(lf.data), time.Since(t0))

	end := int64(len(lf.data))
	for _, run := range []struct {
		db   string
		args []string
	}{{goDB, goArgs}, {sqlDB, sqlArgs}} {
		p := start(t, nil, run.args...)
		waitRunning(t, p)
		db := run.db
		wait(t, 90*time.Second, func() error {
			if pos := storedPosition(t, db, "ledger"); pos != end {
				return fmt.Errorf("%s: stored position %d, want %d", filepath.Base(db), pos, end)
			}
			return nil
		})
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Fatalf("%s: exit code %d after SIGTERM, want 0", filepath.Base(db), code)
		}
	}
	t.Logf("both caught up (%v)", time.Since(t0))

	checkLedger(t, goDB, lf, 0)
	goStore, sqlStore := readStore(t, goDB), readStore(t, sqlDB)
	goOut, sqlOut := ledgerOutputs(t, goStore), ledgerOutputs(t, sqlStore)
	if len(goOut) != len(lf.valid) {
		t.Fatalf("the Go ledger made %d outputs, want %d", len(goOut), len(lf.valid))
	}
	for i := range max(len(goOut), len(sqlOut)) {
		if i >= len(goOut) || i >= len(sqlOut) || goOut[i] != sqlOut[i] {
			t.Fatalf("output %d of %d/%d differs:\n Go:  %s\n SQL: %s", i, len(goOut), len(sqlOut), at(goOut, i), at(sqlOut, i))
		}
	}
	if goDead, sqlDead := deadReasons(t, goStore, "ledger"), deadReasons(t, sqlStore, "ledger"); !reflect.DeepEqual(goDead, sqlDead) {
		t.Fatalf("dead letters differ:\n Go:  %q\n SQL: %q", goDead, sqlDead)
	}
	if got := keyValues(allRows(t, sqlStore), "ledger.dlq"); len(got) != len(lf.malformed) {
		t.Fatalf("the SQL ledger published %d dead letters, want %d", len(got), len(lf.malformed))
	}
	goStats, err := goStore.Feed(context.Background(), "ledger")
	if err != nil {
		t.Fatal(err)
	}
	sqlStats, err := sqlStore.Feed(context.Background(), "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if sqlStats.Applied != goStats.Applied || sqlStats.DeadLettered != goStats.DeadLettered ||
		sqlStats.ReplaysSkipped != 0 || !sqlStats.Lossless || sqlStats.CompletionFailures != 0 {
		t.Fatalf("SQL ledger's stats %+v, the Go ledger's %+v", sqlStats, goStats)
	}
	if got := sqlLedgerBalances(t, sqlStore); !equalBalances(got, lf.balances) {
		t.Fatalf("the SQL ledger's balances differ from the file's sums:\n got %v\nwant %v", got, lf.balances)
	}
	if ok, err := sqlStore.IntegrityCheck(context.Background()); err != nil || ok != "ok" {
		t.Fatalf("integrity_check = %q, %v", ok, err)
	}
	t.Logf("%d lines: %d outputs and %d dead letters, the same from both (%v)", len(lf.valid)+len(lf.malformed),
		len(goOut), len(lf.malformed), time.Since(t0))
}

func at(s []string, i int) string {
	if i >= len(s) {
		return "(none)"
	}
	return s[i]
}
