package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// commit runs statements in one committed store transaction.
func commit(t *testing.T, s *outbox.Store, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func prepare(t *testing.T, s *outbox.Store, text string) *outbox.Query {
	t.Helper()
	q, err := s.PrepareQuery(context.Background(), "q", text)
	if err != nil {
		t.Fatalf("prepare %q: %v", text, err)
	}
	return q
}

// rowsText is a result's rows joined by "|", then its truncation.
func rowsText(r outbox.QueryResult) string {
	var parts []string
	for _, row := range r.Rows {
		parts = append(parts, string(row))
	}
	return strings.Join(parts, "|") + " truncated=" + r.Truncated
}

func TestStore_Query(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	commit(t, s, `INSERT INTO ledger_balances VALUES ('l', 'alice', 7, 2), ('l', 'bob', -3, 1), ('m', 'alice', 100, 1)`)
	lim := outbox.DefaultQueryLimits()

	t.Run("OK", func(t *testing.T) {
		q := prepare(t, s, `SELECT account, balance FROM ledger_balances WHERE feed = :feed AND account = @account`)
		if got := strings.Join(q.Params(), ","); got != "feed,account" {
			t.Fatalf("params %q", got)
		}
		res, err := s.Query(ctx, q, map[string][]string{"feed": {"l"}, "account": {"alice"}}, lim)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := rowsText(res), `{"account":"alice","balance":7} truncated=`; got != want {
			t.Fatalf("rows %s, want %s", got, want)
		}
		if strings.Join(res.Columns, ",") != "account,balance" || res.Bytes != len(`{"account":"alice","balance":7}`) {
			t.Fatalf("columns %q, bytes %d", res.Columns, res.Bytes)
		}
		res, err = s.Query(ctx, q, map[string][]string{"feed": {"l"}, "account": {"carol"}}, lim)
		if err != nil || len(res.Rows) != 0 || res.Rows == nil {
			t.Fatalf("no such account: %#v, %v; want no rows, not null", res.Rows, err)
		}
	})

	t.Run("Types", func(t *testing.T) {
		q := prepare(t, s, `SELECT 1 AS i, 1.5 AS r, 'x"y' AS t, x'00ff' AS b, NULL AS n, 1e999 AS inf, -1e999 AS ninf,
			:v AS v, :v + 1 AS sum, 'a$b' AS "a$b" -- :notaparam
			/* :neither */`)
		res, err := s.Query(ctx, q, map[string][]string{"v": {"41"}}, lim)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"i":1,"r":1.5,"t":"x\"y","b":"AP8=","n":null,"inf":"Infinity","ninf":"-Infinity","v":"41","sum":42,"a$b":"a$b"} truncated=`
		if got := rowsText(res); got != want {
			t.Fatalf("rows %s\nwant %s", got, want)
		}
	})

	t.Run("IntegerColumnFromText", func(t *testing.T) {
		q := prepare(t, s, `SELECT account FROM ledger_balances WHERE balance = :b ORDER BY account`)
		res, err := s.Query(ctx, q, map[string][]string{"b": {"100"}}, lim)
		if err != nil || rowsText(res) != `{"account":"alice"} truncated=` {
			t.Fatalf("rows %s, %v", rowsText(res), err)
		}
	})

	t.Run("Params", func(t *testing.T) {
		q := prepare(t, s, `SELECT balance FROM ledger_balances WHERE feed = :feed AND account = :account`)
		_, err := s.Query(ctx, q, map[string][]string{"feed": {"l", "m"}, "acount": {"x"}, "zz": {""}}, lim)
		var pe *outbox.ParamError
		if !errors.As(err, &pe) {
			t.Fatalf("err %v, want a ParamError", err)
		}
		want := "query q: unknown parameter acount, zz; missing parameter account; given more than once parameter feed"
		if pe.Error() != want {
			t.Fatalf("error %q\nwant  %q", pe.Error(), want)
		}
	})

	t.Run("Limits", func(t *testing.T) {
		q := prepare(t, s, `SELECT feed, account FROM ledger_balances ORDER BY feed, account`)
		for _, tc := range []struct {
			rows, bytes int
			want        string
		}{
			{3, 1 << 20, `{"feed":"l","account":"alice"}|{"feed":"l","account":"bob"}|{"feed":"m","account":"alice"} truncated=`},
			{2, 1 << 20, `{"feed":"l","account":"alice"}|{"feed":"l","account":"bob"} truncated=rows`},
			{3, 58, `{"feed":"l","account":"alice"}|{"feed":"l","account":"bob"} truncated=bytes`},
			{3, 57, `{"feed":"l","account":"alice"} truncated=bytes`},
			{3, 10, ` truncated=bytes`},
		} {
			l := lim
			l.MaxRows, l.MaxBytes = tc.rows, tc.bytes
			res, err := s.Query(ctx, q, nil, l)
			if err != nil {
				t.Fatal(err)
			}
			if got := rowsText(res); got != tc.want || res.Bytes > tc.bytes {
				t.Fatalf("%d rows, %d bytes: %s (%d bytes), want %s", tc.rows, tc.bytes, got, res.Bytes, tc.want)
			}
		}
	})

	t.Run("Timeout", func(t *testing.T) {
		q := prepare(t, s, `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) AS n FROM c`)
		l := lim
		l.Timeout = 50 * time.Millisecond
		start := time.Now()
		_, err := s.Query(ctx, q, nil, l)
		if !errors.Is(err, outbox.ErrQueryTimeout) {
			t.Fatalf("err %v, want ErrQueryTimeout", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("interrupted after %v", d)
		}
		// The read pool goes on answering.
		ok := prepare(t, s, `SELECT count(*) AS n FROM ledger_balances`)
		for range 8 {
			res, err := s.Query(ctx, ok, nil, lim)
			if err != nil || rowsText(res) != `{"n":3} truncated=` {
				t.Fatalf("after a timeout: %s, %v", rowsText(res), err)
			}
		}
	})

	t.Run("OneSnapshotNeverWaits", func(t *testing.T) {
		q := prepare(t, s, `SELECT count(*) AS n, sum(balance) AS total FROM ledger_balances`)
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.Exec(ctx, `INSERT INTO ledger_balances VALUES ('l', 'carol', 1000, 1)`); err != nil {
			t.Fatal(err)
		}
		// The writer holds its transaction open: the query answers from
		// the last commit, at once.
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		res, err := s.Query(qctx, q, nil, lim)
		if err != nil || rowsText(res) != `{"n":3,"total":104} truncated=` {
			t.Fatalf("beside an open write: %s, %v", rowsText(res), err)
		}
	})
}

func TestStore_PrepareQuery(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)

	t.Run("Refused", func(t *testing.T) {
		for text, want := range map[string]string{
			`INSERT INTO ledger_balances VALUES ('l', 'x', 1, 1)`: "starts with INSERT",
			`DELETE FROM outbox`:                                                  "starts with DELETE",
			`WITH x AS (SELECT 1) DELETE FROM outbox`:                             "writes outbox",
			`WITH x AS (SELECT 1) INSERT INTO ledger_balances SELECT 'l','a',1,1`: "writes ledger_balances",
			`PRAGMA writable_schema = 1`:                                          "starts with PRAGMA",
			`SELECT 1 AS a; DELETE FROM outbox`:                                   "more than one statement",
			`SELECT 1 AS a; SELECT 2 AS b`:                                        "more than one statement",
			`SELECT balance FROM ledger_balances WHERE account = ?`:               "positional parameter",
			`SELECT :1 AS a`:                                                      "a name starts with a letter",
			`ATTACH 'x.db' AS x`:                                                  "starts with ATTACH",
			`SELECT load_extension('x') AS a`:                                     "load_extension",
			`SELECT account, account FROM ledger_balances`:                        `two result columns are named "account"`,
			`SELECT 'unterminated`:                                                "unterminated '",
			``:                                                                    "no statement",
			`-- only a comment`:                                                   "no statement",
			`SELEC 1`:                                                             "starts with SELEC",
			`SELECT 1 AS a FROM`:                                                  "incomplete input",
			`SELECT account FROM ledger_balances WHERE feed IN (SELECT feed FROM x)`: "no such table: x",
		} {
			q, err := s.PrepareQuery(ctx, "q", text)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: %v, want an error with %q", text, err, want)
				continue
			}
			if q != nil && !errors.Is(err, outbox.ErrQueryNotReady) {
				t.Errorf("%q: a query beside the error %v", text, err)
			}
		}
	})

	t.Run("Describes", func(t *testing.T) {
		q := prepare(t, s, `SELECT name FROM pragma_table_info('ledger_balances') ORDER BY cid`)
		res, err := s.Query(ctx, q, nil, outbox.DefaultQueryLimits())
		if err != nil || rowsText(res) != `{"name":"feed"}|{"name":"account"}|{"name":"balance"}|{"name":"lines"} truncated=` {
			t.Fatalf("%s, %v", rowsText(res), err)
		}
	})

	t.Run("NotReadyUntilTheTableExists", func(t *testing.T) {
		q, err := s.PrepareQuery(ctx, "later", `SELECT v FROM later WHERE k = :k`)
		if !errors.Is(err, outbox.ErrQueryNotReady) || q == nil {
			t.Fatalf("prepare: %v, %v; want the query and ErrQueryNotReady", q, err)
		}
		if _, err := s.Query(ctx, q, map[string][]string{"k": {"a"}}, outbox.DefaultQueryLimits()); !errors.Is(err, outbox.ErrQueryNotReady) {
			t.Fatalf("run before the table: %v", err)
		}
		if _, err := s.Query(ctx, q, nil, outbox.DefaultQueryLimits()); !strings.Contains(err.Error(), "missing parameter k") {
			t.Fatalf("parameters are checked before the table: %v", err)
		}
		commit(t, s, `CREATE TABLE later (k TEXT PRIMARY KEY, v INTEGER)`, `INSERT INTO later VALUES ('a', 1)`)
		res, err := s.Query(ctx, q, map[string][]string{"k": {"a"}}, outbox.DefaultQueryLimits())
		if err != nil || rowsText(res) != `{"v":1} truncated=` {
			t.Fatalf("after the table: %s, %v", rowsText(res), err)
		}
	})

	t.Run("NotReadyThenRefused", func(t *testing.T) {
		q, err := s.PrepareQuery(ctx, "sneaky", `WITH x AS (SELECT 1) DELETE FROM sneaky`)
		if !errors.Is(err, outbox.ErrQueryNotReady) {
			t.Fatalf("prepare: %v", err)
		}
		commit(t, s, `CREATE TABLE sneaky (a)`, `INSERT INTO sneaky VALUES (1)`)
		if _, err := s.Query(ctx, q, nil, outbox.DefaultQueryLimits()); !errors.Is(err, outbox.ErrQueryRefused) {
			t.Fatalf("run: %v, want ErrQueryRefused", err)
		}
		var n int
		if err := outbox.ReadPoolOf(s).Get(&n, `SELECT count(*) FROM sneaky`); err != nil || n != 1 {
			t.Fatalf("sneaky holds %d rows (%v), want 1", n, err)
		}
	})
}
