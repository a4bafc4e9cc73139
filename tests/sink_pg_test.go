package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
)

// sinkKillRun appends lf to a file while a server with the configuration
// yaml ingests it, relays it to a Kafka broker and to its sinks, killing
// the server with SIGKILL `kills` times at random moments; then a last
// server runs until done says every sink has all, and is stopped.
func sinkKillRun(t *testing.T, rng *rand.Rand, lf ledgerFile, kills int, yaml string, done func() error) (db string) {
	t.Helper()
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db = filepath.Join(dir, "outboxd.db")
	cfg := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfg, "--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--http", "127.0.0.1:0", "--brokers", startBroker(t)}
	writing := appendSlowly(t, input, lf.data, 8*time.Second, rng)
	for range kills {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(30+rng.IntN(400)) * time.Millisecond) // a random moment to crash at
		p.kill()
	}
	<-writing
	p := start(t, nil, args...)
	waitPublished(t, db, int64(len(lf.data)))
	wait(t, 120*time.Second, done)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	return db
}

// ledgerOutputsByPos are the outputs the ledger makes of lf's valid lines, by
// position.
func ledgerOutputsByPos(t *testing.T, lf ledgerFile) map[int64]ledger.Output {
	t.Helper()
	out := map[int64]ledger.Output{}
	bal := map[string]int64{}
	pos := int64(0)
	for _, line := range bytes.SplitAfter(lf.data, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		pos += int64(len(line))
		e, err := ledger.Parse(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r")))
		if err != nil {
			continue
		}
		bal[e.Account] += e.Amount
		out[pos] = ledger.Output{Account: e.Account, Amount: e.Amount, Balance: bal[e.Account], Feed: "ledger", Position: pos}
	}
	if len(out) != len(lf.valid) {
		t.Fatalf("%d outputs of %d valid lines", len(out), len(lf.valid))
	}
	return out
}

// TestSinkPG_KillNine: 20,000 lines, 10 kill -9s; every output of
// ledger.out is in the PostgreSQL table exactly once, with its payload.
func TestSinkPG_KillNine(t *testing.T) {
	pg := pgtest.New(t)
	if !strings.HasPrefix(pg.DSN, "postgres://") {
		t.Skipf("the sink's URL is a postgres:// URL, and the server found is reached by %q", pg.DSN)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 29))
	lf := makeLedger(rng, 20_000)
	want := ledgerOutputsByPos(t, lf)
	c := pg.Conn(t)
	ctx := context.Background()
	count := func() (int, error) {
		var n int
		err := c.QueryRow(ctx, `SELECT count(*) FROM ledger_out`).Scan(&n)
		return n, err
	}
	yaml := fmt.Sprintf(`sinks:
  - name: pg
    url: %q
    topics:
      ledger.out: {table: ledger_out}
    options: {mode: insert, value: jsonb}
`, pg.DSN)
	db := sinkKillRun(t, rng, lf, 10, yaml, func() error {
		n, err := count()
		if err != nil || n < len(want) {
			return fmt.Errorf("ledger_out holds %d rows (%v), want %d", n, err, len(want))
		}
		return nil
	})

	rows, err := c.Query(ctx, `SELECT outbox_id, key, value::text, feed, position, topic FROM ledger_out ORDER BY outbox_id`)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		id, pos          int64
		key              []byte
		value, feed, top string
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (got, error) {
		var g got
		err := r.Scan(&g.id, &g.key, &g.value, &g.feed, &g.pos, &g.top)
		return g, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(want) {
		t.Fatalf("ledger_out holds %d rows, want %d (one per valid line)", len(all), len(want))
	}
	seen := map[int64]bool{}
	var positions []int64
	lastBal := map[string]int64{}
	for _, g := range all {
		var o ledger.Output
		if err := json.Unmarshal([]byte(g.value), &o); err != nil {
			t.Fatalf("row %d: value %q: %v", g.id, g.value, err)
		}
		w, ok := want[g.pos]
		o.Epoch = "" // the file's epoch: not known to the test
		if !ok || o != w || string(g.key) != w.Account || g.feed != "ledger" || g.top != "ledger.out" {
			t.Fatalf("row %d at position %d: %+v key %q feed %q topic %q, want %+v", g.id, g.pos, o, g.key, g.feed, g.top, w)
		}
		if seen[g.pos] {
			t.Fatalf("position %d twice in the table", g.pos)
		}
		seen[g.pos] = true
		positions = append(positions, g.pos)
		lastBal[o.Account] = o.Balance
	}
	checkPositions(t, "ledger_out", positions, lf.valid)
	for acct, b := range lf.balances {
		if lastBal[acct] != b {
			t.Fatalf("%s: last balance %d in the table, want %d", acct, lastBal[acct], b)
		}
	}
	s := readStore(t, db)
	f, err := s.Feed(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if !f.Lossless || f.Applied != int64(len(lf.valid)) {
		t.Fatalf("feed %+v: want lossless with %d applied", f, len(lf.valid))
	}
	last, err := s.LastOutboxID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var progress int64
	if err := c.QueryRow(ctx, `SELECT last_id FROM outboxd_sink_progress WHERE sink = 'pg'`).Scan(&progress); err != nil {
		t.Fatal(err)
	}
	if progress > last || progress < all[len(all)-1].id {
		t.Fatalf("the sink's progress row says %d: want from the last row's id %d to the last outbox id %d", progress, all[len(all)-1].id, last)
	}
}
