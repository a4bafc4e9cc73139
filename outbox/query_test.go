package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
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
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
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
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	ctx := context.Background()
	s, _ := openStore(t)

	t.Run("Refused", func(t *testing.T) {
		for text, want := range map[string]string{
			`INSERT INTO ledger_balances VALUES ('l', 'x', 1, 1)`: "starts with INSERT",
			`DELETE FROM outbox`:                                                                      "starts with DELETE",
			`WITH x AS (SELECT 1) DELETE FROM dead_letters`:                                           "WITH ... DELETE: a query is a SELECT",
			`WITH x AS (SELECT 1) INSERT INTO ledger_balances SELECT 'l','a',1,1`:                     "WITH ... INSERT: a query is a SELECT",
			`WITH x AS (SELECT 1) DELETE FROM balances`:                                               "WITH ... DELETE: a query is a SELECT",
			`WITH x AS (SELECT 1) UPDATE nothing SET a = 1`:                                           "WITH ... UPDATE: a query is a SELECT",
			`WITH x AS (SELECT 1) REPLACE INTO nothing VALUES (1)`:                                    "WITH ... REPLACE: a query is a SELECT",
			`WITH "select" AS (SELECT 1), y(a) AS MATERIALIZED (SELECT 2) /* SELECT */ DELETE FROM t`: "WITH ... DELETE",
			`with recursive replace(a) as (select 1) insert into t select a from replace`:             "WITH ... INSERT",
			`PRAGMA writable_schema = 1`:                                                              "starts with PRAGMA",
			`SELECT 1 AS a; DELETE FROM outbox`:                                                       "more than one statement",
			`SELECT 1 AS a; SELECT 2 AS b`:                                                            "more than one statement",
			`SELECT balance FROM ledger_balances WHERE account = ?`:                                   "positional parameter",
			`SELECT :1 AS a`:                               "a name starts with a letter",
			`ATTACH 'x.db' AS x`:                           "starts with ATTACH",
			`SELECT load_extension('x') AS a`:              "load_extension",
			`SELECT account, account FROM ledger_balances`: `two result columns are named "account"`,
			`SELECT 'unterminated`:                         "unterminated '",
			``:                                             "no statement",
			`-- only a comment`:                            "no statement",
			`SELEC 1`:                                      "starts with SELEC",
			`SELECT 1 AS a FROM`:                           "incomplete input",
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

	// A write is refused by what it does, whether the table it names
	// exists yet or not, with the same words before and after.
	t.Run("RefusedWhateverTheTables", func(t *testing.T) {
		const text = `WITH x AS (SELECT 1) DELETE FROM sneaky`
		_, before := s.PrepareQuery(ctx, "sneaky", text)
		commit(t, s, `CREATE TABLE sneaky (a)`, `INSERT INTO sneaky VALUES (1)`)
		_, after := s.PrepareQuery(ctx, "sneaky", text)
		want := "query sneaky: refused: WITH ... DELETE: a query is a SELECT, VALUES or WITH ... SELECT"
		if !errors.Is(before, outbox.ErrQueryRefused) || before.Error() != want || after == nil || after.Error() != want {
			t.Fatalf("before the table: %v; after: %v; want %q", before, after, want)
		}
		var n int
		if err := outbox.ReadPoolOf(s).Get(&n, `SELECT count(*) FROM sneaky`); err != nil || n != 1 {
			t.Fatalf("sneaky holds %d rows (%v), want 1", n, err)
		}
	})

	t.Run("WithSelect", func(t *testing.T) {
		for text, want := range map[string]string{
			`WITH replace AS (SELECT 1 AS a) SELECT a FROM replace`:                                                 `{"a":1}`,
			`WITH x(a) AS MATERIALIZED (SELECT 2), "delete" AS (SELECT 3) SELECT a FROM x`:                          `{"a":2}`,
			`WITH x AS (SELECT 1 AS a) VALUES ((SELECT a FROM x))`:                                                  `{"column1":1}`,
			`WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3) SELECT sum(x) AS s FROM c`: `{"s":6}`,
		} {
			res, err := s.Query(ctx, prepare(t, s, text), nil, outbox.DefaultQueryLimits())
			if err != nil || rowsText(res) != want+" truncated=" {
				t.Errorf("%q: %s, %v; want %s", text, rowsText(res), err, want)
			}
		}
	})
}

// TestStore_QueryEncoding: every value is encoded byte for byte as
// encoding/json encodes what SQLite gives (the encoder takes no
// reflection for the common ones, and must not differ from it).
func TestStore_QueryEncoding(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	ctx := context.Background()
	s, _ := openStore(t)
	values := []struct {
		sql string
		val any
	}{
		{"0", int64(0)}, {"-1", int64(-1)}, {"9223372036854775807", int64(math.MaxInt64)},
		{"-9223372036854775808", int64(math.MinInt64)},
		{"0.0", 0.0}, {"-0.0", math.Copysign(0, -1)}, {"0.1", 0.1}, {"-2.5", -2.5}, {"1e-6", 1e-6},
		{"9.99e-7", 9.99e-7}, {"1e20", 1e20}, {"1e21", 1e21}, {"123456789.125", 123456789.125},
		{"5e-324", 5e-324}, {"1.7976931348623157e308", math.MaxFloat64},
		{"''", ""}, {"'plain text 123'", "plain text 123"}, {`'a"b'`, `a"b`}, {`'back\slash'`, `back\slash`},
		{"'<b>&amp;'", "<b>&amp;"}, {"char(9, 10, 13, 31, 127)", "\t\n\r\x1f\x7f"}, {"'é ünï 日本'", "é ünï 日本"},
		{"char(8232, 8233)", "\u2028\u2029"}, {"CAST(x'61ff62' AS TEXT)", "a\xffb"},
		{"x''", nil}, // the driver gives an empty blob as nil
		{"x'00ff10'", []byte{0, 0xff, 0x10}}, {"NULL", nil},
	}
	var cols []string
	want := []byte{'{'}
	for i, v := range values {
		name := fmt.Sprintf("c%d", i)
		cols = append(cols, v.sql+" AS "+name)
		if i > 0 {
			want = append(want, ',')
		}
		e, err := json.Marshal(v.val)
		if err != nil {
			t.Fatal(err)
		}
		want = append(append(want, `"`+name+`":`...), e...)
	}
	want = append(want, '}')
	q := prepare(t, s, "SELECT "+strings.Join(cols, ", "))
	res, err := s.Query(ctx, q, nil, outbox.DefaultQueryLimits())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 1 || string(res.Rows[0]) != string(want) || res.Bytes != len(want) {
		t.Fatalf("rows %s (%d bytes)\nwant %s", rowsText(res), res.Bytes, want)
	}
}

// TestStore_QueryConns: queries run on connections of their own, each
// keeping its statements prepared.
func TestStore_QueryConns(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	ctx := context.Background()
	lim := outbox.DefaultQueryLimits()

	t.Run("ManyAtOnce", func(t *testing.T) {
		s, _ := openStore(t)
		commit(t, s, `INSERT INTO ledger_balances VALUES ('l', 'a0', 0, 1), ('l', 'a1', 10, 2), ('l', 'a2', 20, 3),
			('l', 'a3', 30, 4), ('l', 'a4', 40, 5)`)
		q := prepare(t, s, `SELECT account, balance, lines FROM ledger_balances WHERE feed = 'l' AND account = :account`)
		var wg sync.WaitGroup
		errs := make(chan error, 4*outbox.QueryConns)
		for g := range 4 * outbox.QueryConns {
			wg.Go(func() {
				for i := range 100 {
					a := (g + i) % 5
					res, err := s.Query(ctx, q, map[string][]string{"account": {fmt.Sprintf("a%d", a)}}, lim)
					want := fmt.Sprintf(`{"account":"a%d","balance":%d,"lines":%d} truncated=`, a, 10*a, a+1)
					if err != nil || rowsText(res) != want {
						errs <- fmt.Errorf("goroutine %d, run %d: %s, %v; want %s", g, i, rowsText(res), err, want)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	})

	t.Run("LeaveTheReadPool", func(t *testing.T) {
		s, _ := openStore(t)
		slow := prepare(t, s, `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) AS n FROM c`)
		quick := prepare(t, s, `SELECT 1 AS one`)
		long := lim
		long.Timeout = 3 * time.Second
		errs := make(chan error, outbox.QueryConns)
		for range outbox.QueryConns {
			go func() { _, err := s.Query(ctx, slow, nil, long); errs <- err }()
		}
		// Once a quick query finds no connection free, every one runs the
		// slow query.
		testutil.Wait(t, 2*time.Second, func() error {
			short := lim
			short.Timeout = 20 * time.Millisecond
			if _, err := s.Query(ctx, quick, nil, short); !errors.Is(err, outbox.ErrQueryTimeout) {
				return fmt.Errorf("the slow queries do not hold every query connection: a quick query answered %v", err)
			}
			return nil
		})
		// The store's other reads go on, on their own pool.
		start := time.Now()
		fctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := s.Feeds(fctx); err != nil {
			t.Fatalf("a read beside %d running queries: %v", outbox.QueryConns, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("a read beside running queries took %v", d)
		}
		for range outbox.QueryConns {
			if err := <-errs; !errors.Is(err, outbox.ErrQueryTimeout) {
				t.Fatalf("a slow query: %v, want ErrQueryTimeout", err)
			}
		}
		if res, err := s.Query(ctx, quick, nil, lim); err != nil || rowsText(res) != `{"one":1} truncated=` {
			t.Fatalf("after the timeouts: %s, %v", rowsText(res), err)
		}
	})

	t.Run("FirstRunOutOfTimeWhileThePoolOpens", func(t *testing.T) {
		// The store's first run opens the query pool, and its time is up
		// before a connection opens.
		s, _ := openStore(t)
		q := prepare(t, s, `SELECT 1 AS one`)
		none := lim
		none.Timeout = time.Nanosecond
		if _, err := s.Query(ctx, q, nil, none); !errors.Is(err, outbox.ErrQueryTimeout) {
			t.Fatalf("a run with no time: %v, want ErrQueryTimeout", err)
		}
		for i := range 2 {
			if res, err := s.Query(ctx, q, nil, lim); err != nil || rowsText(res) != `{"one":1} truncated=` {
				t.Fatalf("run %d after it: %s, %v", i, rowsText(res), err)
			}
		}
	})

	t.Run("ColumnsChange", func(t *testing.T) {
		s, _ := openStore(t)
		commit(t, s, `CREATE TABLE grows (k TEXT PRIMARY KEY, v INTEGER)`, `INSERT INTO grows VALUES ('a', 1)`)
		q := prepare(t, s, `SELECT * FROM grows`)
		if res, err := s.Query(ctx, q, nil, lim); err != nil || rowsText(res) != `{"k":"a","v":1} truncated=` {
			t.Fatalf("before: %s, %v", rowsText(res), err)
		}
		commit(t, s, `ALTER TABLE grows ADD COLUMN w TEXT DEFAULT 'x'`)
		for range outbox.QueryConns + 1 { // each connection had it prepared
			res, err := s.Query(ctx, q, nil, lim)
			if err != nil || rowsText(res) != `{"k":"a","v":1,"w":"x"} truncated=` || strings.Join(res.Columns, ",") != "k,v,w" {
				t.Fatalf("after a column was added: %s %q, %v", rowsText(res), res.Columns, err)
			}
		}
		commit(t, s, `ALTER TABLE grows RENAME COLUMN v TO value`)
		if res, err := s.Query(ctx, q, nil, lim); err != nil || rowsText(res) != `{"k":"a","value":1,"w":"x"} truncated=` {
			t.Fatalf("after a column was renamed: %s, %v", rowsText(res), err)
		}
	})

	t.Run("PreparedAgainAfterClose", func(t *testing.T) {
		s, _ := openStore(t)
		q := prepare(t, s, `SELECT :v + 1 AS n`)
		for i := range 3 {
			res, err := s.Query(ctx, q, map[string][]string{"v": {strconv.Itoa(i)}}, lim)
			if want := fmt.Sprintf(`{"n":%d} truncated=`, i+1); err != nil || rowsText(res) != want {
				t.Fatalf("run %d: %s, %v; want %s", i, rowsText(res), err, want)
			}
			q.Close()
		}
	})

	t.Run("StoreClosed", func(t *testing.T) {
		cfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "closed.db"))
		s, err := outbox.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		q := prepare(t, s, `SELECT 1 AS one`)
		if _, err := s.Query(ctx, q, nil, lim); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("close with queries prepared: %v", err)
		}
		if _, err := s.Query(ctx, q, nil, lim); err == nil {
			t.Fatal("a query on a closed store answered")
		}
	})
}

// runaway is a query whose first row is quick and whose second never
// comes: x < :n compares an integer with text (the parameter is bound as
// text), which holds for every x, so the recursion never ends while the
// outer WHERE finds nothing past x = 1.
const runaway = `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < :n)
SELECT x FROM c WHERE x = 1 OR x = 0`

// queryWithin runs q and fails the test when it has not returned within
// d: a statement that is never interrupted would hold the test for ever.
func queryWithin(t *testing.T, d time.Duration, ctx context.Context, s *outbox.Store, q *outbox.Query,
	params map[string][]string, lim outbox.QueryLimits) (outbox.QueryResult, error, time.Duration) {
	t.Helper()
	type answer struct {
		res outbox.QueryResult
		err error
	}
	start := time.Now()
	done := make(chan answer, 1)
	go func() {
		res, err := s.Query(ctx, q, params, lim)
		done <- answer{res, err}
	}()
	select {
	case a := <-done:
		return a.res, a.err, time.Since(start)
	case <-time.After(d):
		t.Fatalf("the query still runs after %v", d)
		return outbox.QueryResult{}, nil, 0
	}
}

// TestStore_QueryRunawayLaterRow: the time limit binds every row, not
// only the first: a statement whose later row never comes is interrupted
// at its limit, as is one whose caller's context ends (its client gone);
// every query connection then answers at once, QueryConns at a time.
func TestStore_QueryRunawayLaterRow(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	ctx := context.Background()
	s, _ := openStore(t)
	q := prepare(t, s, runaway)
	one := prepare(t, s, `SELECT 1 AS one`)
	n := map[string][]string{"n": {"5"}}

	t.Run("TimeLimit", func(t *testing.T) {
		lim := outbox.DefaultQueryLimits()
		lim.Timeout = 200 * time.Millisecond
		var wg sync.WaitGroup
		errs := make(chan error, QueryConns)
		for range QueryConns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err, took := queryWithin(t, 30*time.Second, ctx, s, q, n, lim)
				if !errors.Is(err, outbox.ErrQueryTimeout) {
					err = fmt.Errorf("after %v: %v, want ErrQueryTimeout", took, err)
				} else {
					err = nil
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("ContextEnds", func(t *testing.T) {
		lim := outbox.DefaultQueryLimits()
		lim.Timeout = time.Hour
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(200*time.Millisecond, cancel)
		_, err, took := queryWithin(t, 30*time.Second, cctx, s, q, n, lim)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("after %v: %v, want context.Canceled", took, err)
		}
	})

	// Every connection is free and sound again: QueryConns quick queries
	// at once each answer.
	var wg sync.WaitGroup
	for range 2 * QueryConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err, _ := queryWithin(t, 30*time.Second, ctx, s, one, nil, outbox.DefaultQueryLimits())
			if err != nil || rowsText(res) != `{"one":1} truncated=` {
				t.Errorf("after the runaways: %s, %v", rowsText(res), err)
			}
		}()
	}
	wg.Wait()
}

// QueryConns is outbox.QueryConns, short.
const QueryConns = outbox.QueryConns
