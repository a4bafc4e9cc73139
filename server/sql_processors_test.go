package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// balancesYAML declares the SQL processor "balances" and a feed on input
// running it, with its outputs on a topic of their own.
func balancesYAML(input, extra string) string {
	return `processors:
  balances:
    kind: sql
    input: csv
    columns: [account, amount]
    text: [account]
    setup: |
      CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL) STRICT;
    reject: |
      SELECT 'malformed' WHERE :account = '' OR typeof(:amount) <> 'integer';
    apply: |
      INSERT INTO balances VALUES (:account, :amount)
        ON CONFLICT(account) DO UPDATE SET balance = balance + excluded.balance;
    emit: |
      SELECT :account AS key, json_object('account', :account, 'balance', balance, 'position', :position) AS value
      FROM balances WHERE account = :account;
` + extra + `feeds:
  payments: {source: "file:` + input + `", processor: balances}
`
}

func TestParseConfig_Processors(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		c, err := ParseConfig([]string{"--config", writeYAML(t, balancesYAML("/var/log/p.csv", ""))}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		p := c.Processors["balances"]
		if p == nil || p.Kind != "sql" || p.Input != "csv" || !reflect.DeepEqual(p.Columns, []string{"account", "amount"}) ||
			!reflect.DeepEqual(p.Text, []string{"account"}) || !strings.HasPrefix(p.Apply, "INSERT INTO balances VALUES (:account, :amount)\n") {
			t.Fatalf("processor %+v", p)
		}
		if f := c.Feeds["payments"]; f.Processor != "balances" || f.Topic != "payments.out" {
			t.Fatalf("feed %+v", f)
		}
		if o := c.Origin("processors.balances.apply"); !strings.HasSuffix(o, ":11") {
			t.Fatalf("origin of the apply statement %q, want its line 11", o)
		}
	})
	t.Run("ProcessorFlag", func(t *testing.T) {
		path := writeYAML(t, balancesYAML("/var/log/p.csv", ""))
		c, err := ParseConfig([]string{"--config", path, "--feed", "other=file:/a", "--processor", "other=balances"}, env(nil))
		if err != nil || c.Feeds["other"].Processor != "balances" {
			t.Fatalf("feed other %+v: %v", c.Feeds["other"], err)
		}
	})
	for _, tc := range []struct {
		name, yaml, want string // want follows "--config PATH: " when file, else the whole error
		file             bool
	}{
		{name: "UnknownKey", file: true, yaml: "processors:\n  p:\n    kind: sql\n    colums: [a]\n",
			want: "line 3: processors.p: input: missing, want one of csv, json, raw\n--config PATH: line 4: unknown key processors.p.colums (the closest known key is processors.p.columns)"},
		{name: "ColumnsNotAList", file: true, yaml: "processors:\n  p:\n    kind: sql\n    columns: {a: 1}\n",
			want: "line 3: processors.p: input: missing, want one of csv, json, raw\n--config PATH: line 4: processors.p.columns: want a list of values (or one comma-separated value), not a mapping"},
		{name: "DefinedTwice", file: true, yaml: "processors:\n  p:\n    kind: sql\n  p:\n    kind: sql\n",
			want: "line 3: processors.p: input: missing, want one of csv, json, raw\n--config PATH: line 4: processors.p: given twice (first on line 2)"},
		{name: "BuiltinName", file: true, yaml: "processors:\n  ledger:\n    kind: sql\n    input: raw\n    apply: DELETE FROM t\n",
			want: "line 3: processors.ledger: the name is the registered processor ledger's; give it another"},
		{name: "NoKind", file: true, yaml: "processors:\n  p:\n    input: raw\n    apply: DELETE FROM t\n",
			want: `line 3: processors.p: kind "", want "sql"`},
		{name: "NoInput", file: true, yaml: "processors:\n  p:\n    kind: sql\n    apply: DELETE FROM t\n",
			want: "line 3: processors.p: input: missing, want one of csv, json, raw"},
		{name: "UnknownParameter", file: true, yaml: "processors:\n  p:\n    kind: sql\n    input: csv\n    columns: [a]\n    apply: DELETE FROM t WHERE x = :b\n",
			want: "line 6: processors.p: apply (DELETE FROM t WHERE x = :b): unknown parameter :b (known: :feed, :partition, :topic, :epoch, :position, :sequence, :attempt, :key, :value, :headers, :a)"},
		{name: "UnknownProcessor", file: true, yaml: "processors:\n  p:\n    kind: sql\n    input: raw\n    apply: DELETE FROM t\nfeeds:\n  f: {source: file:/a, processor: q}\n",
			want: `line 7: feeds.f.processor: unknown processor "q" (registered: forward, ledger, orders, p)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeYAML(t, tc.yaml)
			_, err := ParseConfig([]string{"--config", path}, env(nil))
			want := tc.want
			if tc.file {
				want = "--config " + path + ": " + strings.ReplaceAll(tc.want, "PATH", path)
			}
			if err == nil || err.Error() != want {
				t.Fatalf("err = %v\nwant  %s", err, want)
			}
		})
	}
}

// TestRenderConfig_Processors: `server config` prints the processors
// section, statements as block text, and reads back to the same
// configuration.
func TestRenderConfig_Processors(t *testing.T) {
	extra := `  events:
    kind: sql
    input: json
    fields: {id: $.id, "n": "$.a[0]"}
    required: [id]
    topic: events.out
    emit: "SELECT :id AS key, :n AS value"
    migrations:
      - {version: 2, sql: "CREATE INDEX e_id ON e (id)"}
`
	path := writeYAML(t, balancesYAML("/var/log/p.csv", extra))
	c, err := ParseConfig([]string{"--config", path}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	out, err := RenderConfig(c, false)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseConfig([]string{"--config", writeYAML(t, string(out))}, env(nil))
	if err != nil {
		t.Fatalf("reading back:\n%s\n%v", out, err)
	}
	c.origins, back.origins = nil, nil
	if !reflect.DeepEqual(c, back) {
		t.Fatalf("read back\n%+v\nwant\n%+v\nfrom:\n%s", back.Processors, c.Processors, out)
	}
	for _, line := range []string{
		"    columns: [account, amount] # from " + path + ":5",
		"    apply: | # from " + path + ":11",
		"      INSERT INTO balances VALUES (:account, :amount)",
		"        ON CONFLICT(account) DO UPDATE SET balance = balance + excluded.balance;",
		"      id: $.id # from " + path + ":20",
	} {
		if !strings.Contains(string(out), line+"\n") {
			t.Errorf("no line %q in:\n%s", line, out)
		}
	}
}

// TestCommand_SQLProcessorMistakes: a statement that cannot run is one
// line at start, naming the feed, the processor and the statement, exit
// code 2, before the database is created.
func TestCommand_SQLProcessorMistakes(t *testing.T) {
	for _, tc := range []struct{ name, from, to, want string }{
		// Found as the configuration is read: the file alone shows it.
		{"UnknownParameter", "'position', :position", "'position', :offset",
			"server: --config PATH: line 14: processors.balances: emit (SELECT :account AS key, json_object('account', : ...): unknown parameter :offset (known: :feed, "},
		{"BadSQL", "ON CONFLICT(account)", "ON CONFLICT(acount)",
			"apply (INSERT INTO balances VALUES (:account, :amount) ...): no such column: acount"},
		{"EmitLacksValue", ") AS value", ") AS val",
			`emit (SELECT :account AS key, json_object('account', : ...): column "val" is not one of topic, key, value, headers (name columns with AS)`},
		{"EmitLacksKey", "SELECT :account AS key,", "SELECT",
			`emit (SELECT json_object('account', :account, 'balance ...): no column "key" (columns: value)`},
		{"NoSuchTable", "FROM balances WHERE", "FROM balance WHERE",
			"emit (SELECT :account AS key, json_object('account', : ...): no such table: balance"},
		{"ForbiddenTable", "INSERT INTO balances VALUES (:account, :amount)\n        ON CONFLICT(account) DO UPDATE SET balance = balance + excluded.balance;",
			"DELETE FROM outbox_chunks;", "apply (DELETE FROM outbox_chunks): writes outboxd's table outbox_chunks (user SQL may read outboxd's tables, never write them)"},
		{"TransactionControl", "INSERT INTO balances VALUES (:account, :amount)\n        ON CONFLICT(account) DO UPDATE SET balance = balance + excluded.balance;",
			"COMMIT;", "apply (COMMIT): COMMIT: each item runs in outboxd's own transaction"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := balancesYAML(filepath.Join(dir, "in.csv"), "")
			if !strings.Contains(src, tc.from) {
				t.Fatalf("the configuration holds no %q", tc.from)
			}
			path := writeYAML(t, strings.Replace(src, tc.from, tc.to, 1))
			if err := os.WriteFile(filepath.Join(dir, "in.csv"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			db := filepath.Join(dir, "data", "outboxd.db")
			var out, errOut bytes.Buffer
			code := Command([]string{"--config", path, "--db", db, "--relay", "none", "--http", "127.0.0.1:0"}, &out, &errOut)
			if code != ExitConfig {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, ExitConfig, errOut.String())
			}
			lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
			want := strings.Replace(tc.want, "PATH", path, 1)
			if !strings.HasPrefix(want, "server: ") {
				want = "server: feed payments: processors.balances: " + want
			}
			if len(lines) != 1 || !strings.HasPrefix(lines[0], want) {
				t.Fatalf("stderr %q\nwant one line starting %q", errOut.String(), want)
			}
			if _, err := os.Stat(filepath.Dir(db)); !os.IsNotExist(err) {
				t.Fatalf("the database's directory exists after a refused start (%v)", err)
			}
		})
	}
}

// TestMain_SQLProcessor runs a feed through a SQL processor declared in
// the file: outputs on the feed's topic, a reject row a dead letter, the
// state in the processor's table, and a write to outboxd's tables that a
// trigger in the database would make refused at run time.
func TestMain_SQLProcessor(t *testing.T) {
	dir := t.TempDir()
	input, db := filepath.Join(dir, "in.csv"), filepath.Join(dir, "outboxd.db")
	data := "alice,10\nbob,5\nalice,-3\nnot a line\n"
	if err := os.WriteFile(input, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeYAML(t, balancesYAML(input, ""))
	r := runMain(t, "--config", path, "--db", db, "--relay", "none", "--http", "127.0.0.1:0")
	r.ready(t)
	s := r.m.Store
	wait(t, 30*time.Second, func() error {
		if got := feedPosition(t, s, "payments"); got != int64(len(data)) {
			return fmt.Errorf("stored position %d, want %d", got, len(data))
		}
		return nil
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rs := readRows(t, db)
	want := []string{
		`payments.out alice {"account":"alice","balance":10,"position":9}`,
		`payments.out bob {"account":"bob","balance":5,"position":15}`,
		`payments.out alice {"account":"alice","balance":7,"position":24}`,
		`payments.dlq  not a line`,
	}
	if !reflect.DeepEqual(rs, want) {
		t.Fatalf("outbox rows\n%q\nwant\n%q", rs, want)
	}
	rd := outboxtest.StoreAt(t, db)
	var bal []string
	if err := outboxtest.Select(context.Background(), rd, &bal, "SELECT account || '=' || balance FROM balances ORDER BY account"); err != nil ||
		strings.Join(bal, " ") != "alice=7 bob=5" {
		t.Fatalf("balances %q (%v), want alice=7 bob=5", bal, err)
	}
	dls, err := rd.DeadLetters(context.Background(), "payments", 0, 10)
	if err != nil || len(dls) != 1 || dls[0].Reason != "malformed" || dls[0].Position != int64(len(data)) {
		t.Fatalf("dead letters %+v (%v), want the last line's, malformed", dls, err)
	}
}

func feedPosition(t *testing.T, s *outbox.Store, feed string) int64 {
	t.Helper()
	cps, err := s.ReadPositions(context.Background(), feed)
	if err != nil || len(cps) == 0 {
		return -1
	}
	return cps[0].Position
}

// readRows lists the outbox's rows as "topic key value".
func readRows(t *testing.T, db string) []string {
	t.Helper()
	rows, err := outboxtest.StoreAt(t, db).Rows(context.Background(), 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		out = append(out, fmt.Sprintf("%s %s %s", r.Topic, r.Key, r.Value))
	}
	return out
}

// readsYAML has a processor statements reading the balances of feed
// payments, with reads: reads.
func readsYAML(reads string) string {
	return balancesYAML("/var/log/p.csv", `  audit:
    kind: sql
    input: csv
    columns: [account]
    topic: audit.out
    reads: `+reads+`
    emit: |
      SELECT :account AS key, CAST(coalesce(max(balance), 0) AS TEXT) AS value FROM balances WHERE account = :account;
`) + `  audits: {source: "file:/var/log/a.csv", processor: audit}
`
}

func TestSQLProcessor_Reads(t *testing.T) {
	start := func(reads string) error {
		t.Helper()
		c, err := ParseConfig([]string{"--config", writeYAML(t, readsYAML(reads))}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		_, err = newSQLProcessor("audits", c.Feeds["audits"], c)
		return err
	}
	for _, reads := range []string{"[payments]", "[payments.balances]", "[payments.balances, payments]"} {
		if err := start(reads); err != nil {
			t.Fatalf("reads %s: %v", reads, err)
		}
	}
	for reads, want := range map[string]string{
		"[]":                "feed audits: processors.audit: emit (SELECT :account AS key, CAST(coalesce(max(balanc ...): no such table: balances",
		"[nofeed]":          `feed audits: processors.audit: reads: "nofeed" names no feed (FEED or FEED.TABLE; feeds: audits, payments)`,
		"[payments.nope]":   "feed audits: processors.audit: reads: feed payments's processor balances makes no table nope (its tables: balances)",
		"[audits]":          "feed audits: processors.audit: reads: feed audits's processor audit reads this one: audit -> audit",
		"[audits.balances]": "feed audits: processors.audit: reads: feed audits's processor audit reads this one: audit -> audit",
	} {
		err := start(reads)
		if err == nil || err.Error() != want {
			t.Errorf("reads %s: %v\nwant %s", reads, err, want)
		}
		var ce *ConfigError
		if err != nil && !errors.As(err, &ce) {
			t.Errorf("reads %s: %T is not a *ConfigError (exit 2)", reads, err)
		}
	}
}

// TestSQLProcessor_Postgres: on --db postgres:// a SQL processor is made
// for PostgreSQL (its SQL is not judged by SQLite's check, PostgreSQL
// PREPAREs it at the feed's start); on a SQLite --db the same SQL is
// SQLite's check's to refuse.
func TestSQLProcessor_Postgres(t *testing.T) {
	yml := `processors:
  pg:
    kind: sql
    input: csv
    columns: [account]
    topic: pg.out
    emit: |
      SELECT CAST(:account AS text) AS key, CAST(CAST(:account AS text) ~ '^a' AS text) AS value;
feeds:
  f: {source: "file:/var/log/f.csv", processor: pg}
`
	for _, db := range []string{"postgres://postgres@127.0.0.1:5432/x?sslmode=disable", ""} {
		args := []string{"--config", writeYAML(t, yml)}
		if db != "" {
			args = append(args, "--db", db)
		}
		c, err := ParseConfig(args, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		_, err = newSQLProcessor("f", c.Feeds["f"], c)
		if db != "" && err != nil {
			t.Fatalf("on PostgreSQL: %v", err)
		}
		if db == "" && (err == nil || !strings.Contains(err.Error(), "feed f: processors.pg: emit (")) {
			t.Fatalf("on SQLite: %v, want the emit statement refused", err)
		}
	}
}
