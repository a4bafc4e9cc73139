package sqlproc_test

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// openPGStore opens a store on a database of the test's own.
func openPGStore(t *testing.T) *outbox.Store {
	t.Helper()
	return outboxtest.OpenStore(t, outbox.DefaultConfig(pgtest.New(t).DSN))
}

func newPGProc(tb testing.TB, cfg sqlproc.Config) *sqlproc.Processor {
	tb.Helper()
	p, err := sqlproc.NewPostgres(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestGolden_LedgerPostgres runs the Go ledger on SQLite and the SQL
// ledger of testdata/ledger.pg.yaml on PostgreSQL through the real file
// feed and loop over the same file: the outputs, the dead letters and the
// balances are the same, byte for byte.
func TestGolden_LedgerPostgres(t *testing.T) {
	lines := goldenInput(3000, 1)
	path, ends := writeLines(t, lines...)
	end := ends[len(ends)-1]

	goStore := openStore(t, nil)
	goRun := startLoop(t, goStore, "ledger", path, ledger.New("ledger.out"), nil)
	pgStore := openPGStore(t)
	pgRun := startLoop(t, pgStore, "ledger", path, newPGProc(t, loadConfig(t, "ledger", "testdata/ledger.pg.yaml")), nil)
	waitApplied(t, goStore, "ledger", end)
	waitApplied(t, pgStore, "ledger", end)
	goRun.stop(t)
	pgRun.stop(t)

	goOut, pgOut := ledgerOutputs(t, goStore), ledgerOutputs(t, pgStore)
	if len(goOut) < 2500 {
		t.Fatalf("the Go ledger made %d outputs of %d lines: the input is not what the test means", len(goOut), len(lines))
	}
	for i := range max(len(goOut), len(pgOut)) {
		if i >= len(goOut) || i >= len(pgOut) || !reflect.DeepEqual(goOut[i], pgOut[i]) {
			t.Fatalf("output %d of %d/%d differs:\n Go:  %s\n PG:  %s", i, len(goOut), len(pgOut), describe(goOut, i), describe(pgOut, i))
		}
	}
	goDead, pgDead := deadPlaces(t, goStore), deadPlaces(t, pgStore)
	if len(goDead) < 100 {
		t.Fatalf("the Go ledger dead-lettered %d lines: the input is not what the test means", len(goDead))
	}
	if !reflect.DeepEqual(goDead, pgDead) {
		t.Fatalf("dead letters differ:\n Go:  %v\n PG:  %v", goDead, pgDead)
	}
	for i, dl := range deadLetters(t, pgStore, "ledger") {
		if want := lineAt(lines, ends, dl.Position); string(dl.Payload) != want {
			t.Fatalf("dead letter %d holds %q, want the line %q", i, dl.Payload, want)
		}
	}
	goBal, err := ledger.Balances(context.Background(), goStore, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if pgBal := sqlBalances(t, pgStore); !reflect.DeepEqual(goBal, pgBal) || len(goBal) < 10 {
		t.Fatalf("balances differ:\n Go:  %v\n PG:  %v", goBal, pgBal)
	}
	t.Logf("%d lines: %d outputs, %d dead letters, %d accounts, all equal", len(lines), len(goOut), len(goDead), len(goBal))
}

// pgSetup makes cfg's processor with NewPostgres and runs its Setup in a
// transaction on s, committed when it succeeds.
func pgSetup(t *testing.T, s *outbox.Store, cfg sqlproc.Config) error {
	t.Helper()
	p, err := sqlproc.NewPostgres(cfg)
	if err != nil {
		return err
	}
	tx, err := s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := p.Setup(context.Background(), tx); err != nil {
		return err
	}
	return tx.Commit()
}

// TestPostgres_Guard: on PostgreSQL, Setup refuses, in one line naming
// the processor and the statement, a statement that writes outboxd's
// tables or another processor's, a setup that changes outboxd's tables or
// does what setup may not, a statement PostgreSQL cannot prepare; the
// processor's own SQL passes, a data-modifying WITH on its own table
// included.
func TestPostgres_Guard(t *testing.T) {
	s := openPGStore(t)
	other := sqlproc.Config{Name: "other", Topic: "o", Input: "raw", Setup: `CREATE TABLE IF NOT EXISTS other_totals (k TEXT PRIMARY KEY, n BIGINT NOT NULL)`,
		Apply: `INSERT INTO other_totals (k, n) VALUES (:key, 1) ON CONFLICT (k) DO UPDATE SET n = other_totals.n + 1`}
	if err := pgSetup(t, s, other); err != nil {
		t.Fatalf("the other processor's setup: %v", err)
	}
	own := `CREATE TABLE IF NOT EXISTS mine (k TEXT PRIMARY KEY, n BIGINT NOT NULL)`
	cases := []struct {
		name, setup, apply, emit string
		want                     string // "" for none
	}{
		{"own", own, `INSERT INTO mine (k, n) VALUES (:key, 1) ON CONFLICT (k) DO UPDATE SET n = mine.n + 1`, "", ""},
		{"own WITH", own, `WITH d AS (DELETE FROM mine WHERE k = :key RETURNING n) INSERT INTO mine (k, n) SELECT :key, coalesce(sum(n), 0) + 1 FROM d`, "", ""},
		{"reads outboxd's", own, `INSERT INTO mine (k, n) SELECT :key, count(*) FROM outbox`, "", ""},
		{"writes the outbox view", own, `INSERT INTO outbox (topic) VALUES (:key)`, "",
			`sqlproc p: apply (INSERT INTO outbox (topic) VALUES (:key)): cannot insert into view "outbox" (SQLSTATE 55000)`},
		{"writes the outbox's table", own, `DELETE FROM outbox_chunks WHERE feed = :key`, "",
			"sqlproc p: apply (DELETE FROM outbox_chunks WHERE feed = :key): writes table outbox_chunks, which is not the processor's own (its setup and migrations create mine)"},
		{"deletes outboxd's", own, `DELETE FROM processor_migrations`, "",
			"sqlproc p: apply (DELETE FROM processor_migrations): writes table processor_migrations, which is not the processor's own (its setup and migrations create mine)"},
		{"writes another processor's", own, `UPDATE other_totals SET n = 0 WHERE k = :key`, "",
			"sqlproc p: apply (UPDATE other_totals SET n = 0 WHERE k = :key): writes table other_totals, which is not the processor's own (its setup and migrations create mine)"},
		{"WITH writes the outbox's table", own, `WITH d AS (DELETE FROM outbox_chunks RETURNING feed) INSERT INTO mine (k, n) SELECT :key, count(*) FROM d`, "",
			"sqlproc p: apply (WITH d AS (DELETE FROM outbox_chunks RETURNING f ...): writes table outbox_chunks, which is not the processor's own (its setup and migrations create mine)"},
		{"emit writes another processor's", own, `INSERT INTO mine (k, n) VALUES (:key, 1) ON CONFLICT (k) DO NOTHING`, `WITH d AS (UPDATE other_totals SET n = 0 RETURNING k) SELECT :key AS key, 'v' AS value FROM d`,
			"sqlproc p: emit (WITH d AS (UPDATE other_totals SET n = 0 RETURNI ...): writes table other_totals, which is not the processor's own (its setup and migrations create mine)"},
		{"setup claims another processor's", `CREATE TABLE IF NOT EXISTS other_totals (k TEXT PRIMARY KEY, n BIGINT NOT NULL)`, `UPDATE other_totals SET n = 0`, "",
			`sqlproc p: its setup creates table other_totals, which exists and is not the processor's own (it has no comment "outboxd: sqlproc p")`},
		{"setup changes another processor's", own + `; ALTER TABLE other_totals ADD COLUMN x INT`, `SELECT 1`, "",
			"sqlproc p: setup statement 2 (ALTER TABLE other_totals ADD COLUMN x INT): changes table other_totals, which is not the processor's own (its setup and migrations create mine)"},
		{"setup drops the outbox", "DROP TABLE outbox", `SELECT 1`, "",
			"sqlproc p: setup (DROP TABLE outbox): changes outboxd's table outbox (user SQL may read outboxd's tables, never write them)"},
		{"setup alters outboxd's", `ALTER TABLE IF EXISTS "processor_migrations" ADD COLUMN x INT`, `SELECT 1`, "",
			`sqlproc p: setup (ALTER TABLE IF EXISTS "processor_migrations" ADD ...): changes outboxd's table processor_migrations (user SQL may read outboxd's tables, never write them)`},
		{"setup makes a function", own + `; CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'`, `SELECT 1`, "",
			"sqlproc p: setup statement 2 (CREATE FUNCTION f() RETURNS int LANGUAGE sql AS ...): CREATE FUNCTION: on PostgreSQL, setup and migrations hold CREATE TABLE, CREATE INDEX, ALTER TABLE, DROP TABLE, DROP INDEX, INSERT, UPDATE and DELETE only"},
		{"apply sets the role", own, `SET ROLE postgres`, "",
			"sqlproc p: apply (SET ROLE postgres): on PostgreSQL, a statement run for an item is a SELECT, INSERT, UPDATE, DELETE, WITH or VALUES"},
		{"missing table", own, `INSERT INTO nosuch (k) VALUES (:key)`, "",
			`sqlproc p: apply (INSERT INTO nosuch (k) VALUES (:key)): relation "nosuch" does not exist (SQLSTATE 42P01)`},
		{"syntax error", own, `INSERT INTO mine VALUES (:key,`, "",
			`sqlproc p: apply (INSERT INTO mine VALUES (:key,): syntax error at end of input (SQLSTATE 42601)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := sqlproc.Config{Name: "p", Topic: "p.out", Input: "raw", Setup: c.setup, Apply: c.apply, Emit: c.emit}
			err := pgSetup(t, s, cfg)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || err.Error() != c.want):
				t.Fatalf("error %v\nwant %s", err, c.want)
			}
		})
	}
}

// TestPostgres_Dedup runs testdata/dedup.pg.yaml on PostgreSQL through
// the real file feed and loop: the first document of each id is output
// once, in order, its later copies none, one without an id a dead letter.
func TestPostgres_Dedup(t *testing.T) {
	lines := []string{`{"id":"p-1","amount":10}`, `{"id":"p-2","amount":5}`, `{"id":"p-1","amount":10}`, `{"amount":3}`,
		`{"id":"p-3"}`, `{"id":"p-2","amount":5}`, `{"id":""}`}
	path, ends := writeLines(t, lines...)
	s := openPGStore(t)
	run := startLoop(t, s, "payments", path, newPGProc(t, loadConfig(t, "dedup", "testdata/dedup.pg.yaml")), nil)
	waitApplied(t, s, "payments", ends[len(ends)-1])
	run.stop(t)
	var got []string
	for _, r := range rows(t, s) {
		if r.Topic == "payments.unique" {
			got = append(got, fmt.Sprintf("%d %s %s", r.Position, r.Key, r.Value))
		}
	}
	want := []string{
		fmt.Sprintf("%d p-1 %s", ends[0], lines[0]),
		fmt.Sprintf("%d p-2 %s", ends[1], lines[1]),
		fmt.Sprintf("%d p-3 %s", ends[4], lines[4]),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var dead []string
	for _, dl := range deadLetters(t, s, "payments") {
		dead = append(dead, fmt.Sprintf("%d %s", dl.Position, dl.Reason))
	}
	if w := []string{fmt.Sprintf("%d malformed", ends[3]), fmt.Sprintf("%d malformed", ends[6])}; !reflect.DeepEqual(dead, w) {
		t.Fatalf("dead letters %v, want %v", dead, w)
	}
}

// TestPostgres_Examples: the examples' SQLite SQL on PostgreSQL is refused
// at start in one line naming the processor, the statement and
// PostgreSQL's message (or what does not run there), nothing created.
func TestPostgres_Examples(t *testing.T) {
	want := map[string]string{
		"dedup":             `sqlproc dedup: setup (CREATE TABLE IF NOT EXISTS payments_seen ( id TE ...): syntax error at or near "STRICT" (SQLSTATE 42601)`,
		"sql-ledger":        `sqlproc sql-ledger: setup (CREATE TABLE IF NOT EXISTS balances ( account TE ...): syntax error at or near "STRICT" (SQLSTATE 42601)`,
		"sql-orders":        `sqlproc sql-orders: setup statement 4 (INSERT OR IGNORE INTO order_transitions VALUES ( ...): INSERT OR IGNORE/REPLACE and REPLACE INTO are SQLite's: on PostgreSQL write INSERT ... ON CONFLICT DO NOTHING or DO UPDATE`,
		"clicks-per-minute": `sqlproc clicks-per-minute: window and reads run on a SQLite --db only in this version`,
	}
	got := map[string]string{}
	for _, ex := range []string{"dedup", "ledger", "orders", "windows"} {
		src, err := os.ReadFile("../../examples/" + ex + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Processors map[string]sqlproc.Config `yaml:"processors"`
		}
		if err := yaml.Unmarshal(src, &file); err != nil {
			t.Fatal(err)
		}
		for name, cfg := range file.Processors {
			cfg.Name = name
			s := openPGStore(t)
			err := pgSetup(t, s, cfg)
			if err == nil {
				t.Fatalf("%s: %s ran on PostgreSQL", ex, name)
			}
			got[name] = err.Error()
		}
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %q\nwant %q", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("processors %v, want %d", got, len(want))
	}
}
