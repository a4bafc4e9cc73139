package sqlproc_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// out is an output row as a test compares it.
type out struct {
	Position int64
	N        int
	Topic    string
	Key      *string
	Value    *string
	Headers  []outbox.Header
}

func str(s string) *string { return &s }

func outputs(t *testing.T, s *outbox.Store) []out {
	t.Helper()
	var got []out
	for _, r := range rows(t, s) {
		o := out{Position: r.Position, N: r.N, Topic: r.Topic}
		if r.Key != nil {
			o.Key = str(string(r.Key))
		}
		if r.Value != nil {
			o.Value = str(string(r.Value))
		}
		hs, err := outbox.DecodeHeaders(r.Headers)
		if err != nil {
			t.Fatal(err)
		}
		o.Headers = hs
		got = append(got, o)
	}
	return got
}

func sameOutputs(t *testing.T, got, want []out) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs:\n%s\nwant:\n%s", fmtOuts(got), fmtOuts(want))
	}
}

func fmtOuts(os []out) string {
	s := ""
	for _, o := range os {
		k, v := "NULL", "NULL"
		if o.Key != nil {
			k = fmt.Sprintf("%q", *o.Key)
		}
		if o.Value != nil {
			v = fmt.Sprintf("%q", *o.Value)
		}
		s += fmt.Sprintf("  %d/%d %s key=%s value=%s headers=%v\n", o.Position, o.N, o.Topic, k, v, o.Headers)
	}
	return s
}

// counts returns t's rows as account -> n.
func counts(t *testing.T, s *outbox.Store, table string) map[string]int64 {
	t.Helper()
	var rs []struct {
		Account string `db:"account"`
		N       int64  `db:"n"`
	}
	if err := outboxtest.Select(context.Background(), s, &rs, "SELECT account, n FROM "+table); err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, r := range rs {
		m[r.Account] = r.N
	}
	return m
}

// permanent checks err is a dead letter with reason and message.
func permanent(t *testing.T, err error, reason, msg string) {
	t.Helper()
	p, ok := ingest.IsPermanent(err)
	if !ok {
		t.Fatalf("error %v is not permanent", err)
	}
	if p.Reason != reason || p.Err.Error() != msg {
		t.Fatalf("dead letter (%q, %q), want (%q, %q)", p.Reason, p.Err.Error(), reason, msg)
	}
}

func TestProcessor_Apply(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		s := openStore(t, nil)
		p := newProc(t, csvConfig())
		setup(t, s, p)
		for i, l := range []string{"a,5", "b,3", "a,-2"} {
			if err := applyItem(t, s, p, at(int64(i+1)), line(l)); err != nil {
				t.Fatal(err)
			}
		}
		sameOutputs(t, outputs(t, s), []out{
			{Position: 1, Topic: "p.out", Key: str("a"), Value: str("5")},
			{Position: 2, Topic: "p.out", Key: str("b"), Value: str("3")},
			{Position: 3, Topic: "p.out", Key: str("a"), Value: str("3")},
		})
		if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 3, "b": 3}) {
			t.Fatalf("state = %v", got)
		}
	})

	t.Run("Parameters", func(t *testing.T) {
		s := openStore(t, nil)
		p := newProc(t, sqlproc.Config{Name: "p", Input: sqlproc.InputRaw, Topic: "p.out",
			Emit: `SELECT 'k' AS key, json_object(
				'feed', :feed, 'partition', :partition, 'topic', :topic, 'epoch', :epoch, 'position', :position,
				'sequence', :sequence, 'attempt', :attempt, 'key', iif(typeof(:key) = 'blob', hex(:key), :key), 'value', :value, 'headers', json(:headers),
				'types', typeof(:feed) || typeof(:partition) || typeof(:topic) || typeof(:epoch) || typeof(:position)
				         || typeof(:sequence) || typeof(:attempt) || typeof(:key) || typeof(:value) || typeof(:headers)) AS value`})
		setup(t, s, p)
		kafka := ingest.Delivery{Feed: "orders", Partition: 3, Topic: "in", Epoch: "uuid-3", Position: 42, Sequence: 7, Attempt: 2}
		item := ingest.Item{Key: []byte("o-1"), Value: []byte(`{"a":1}`), Headers: []outbox.Header{
			{Key: "trace", Value: []byte("t1")}, {Key: "x", Value: []byte("1")}, {Key: "trace", Value: []byte("t2")}}}
		if err := applyItem(t, s, p, kafka, item); err != nil {
			t.Fatal(err)
		}
		// A file line: no topic, no key, no headers.
		if err := applyItem(t, s, p, at(9), line("plain")); err != nil {
			t.Fatal(err)
		}
		// A tombstone and a key that is not UTF-8.
		if err := applyItem(t, s, p, ingest.Delivery{Feed: "f", Topic: "in", Epoch: "e", Position: 10, Sequence: 2, Attempt: 1},
			ingest.Item{Key: []byte{0xff, 'k'}}); err != nil {
			t.Fatal(err)
		}
		sameOutputs(t, outputs(t, s), []out{
			{Position: 42, Topic: "p.out", Key: str("k"), Value: str(`{"feed":"orders","partition":3,"topic":"in","epoch":"uuid-3","position":42,` +
				`"sequence":7,"attempt":2,"key":"o-1","value":"{\"a\":1}","headers":{"trace":"t2","x":"1"},` +
				`"types":"textintegertexttextintegerintegerintegertexttexttext"}`)},
			{Position: 9, Topic: "p.out", Key: str("k"), Value: str(`{"feed":"f","partition":0,"topic":null,"epoch":"e1","position":9,` +
				`"sequence":9,"attempt":1,"key":null,"value":"plain","headers":{},` +
				`"types":"textintegernulltextintegerintegerintegernulltexttext"}`)},
			{Position: 10, Topic: "p.out", Key: str("k"), Value: str(`{"feed":"f","partition":0,"topic":"in","epoch":"e","position":10,` +
				`"sequence":2,"attempt":1,"key":"FF6B","value":null,"headers":{},` +
				`"types":"textintegertexttextintegerintegerintegerblobnulltext"}`)},
		})
	})

	t.Run("DecodedTypes", func(t *testing.T) {
		s := openStore(t, nil)
		p := newProc(t, sqlproc.Config{Name: "p", Input: sqlproc.InputJSON, Topic: "p.out",
			Fields: map[string]string{"s": "$.s", "i": "$.n.i", "r": "$.n.r", "b": "$.b", "o": "$.o", "m": "$.missing"},
			Emit: `SELECT 'k' AS key, typeof(:s) || ' ' || typeof(:i) || ' ' || typeof(:r) || ' ' || typeof(:b) || ' ' ||
				typeof(:o) || ' ' || typeof(:m) || ' ' || json_extract(:o, '$[1].z') AS value`})
		setup(t, s, p)
		if err := applyItem(t, s, p, at(1), line(`{"s":"x","n":{"i":3,"r":0.5},"b":true,"o":[1,{"z":"deep"}]}`)); err != nil {
			t.Fatal(err)
		}
		sameOutputs(t, outputs(t, s), []out{{Position: 1, Topic: "p.out", Key: str("k"), Value: str("text integer real integer text null deep")}})
	})

	t.Run("ErrMalformed", func(t *testing.T) {
		s := openStore(t, nil)
		p := newProc(t, csvConfig())
		setup(t, s, p)
		jcfg := sqlproc.Config{Name: "j", Input: sqlproc.InputJSON, Topic: "j.out", Fields: map[string]string{"a": "$.a"},
			Required: []string{"a"}, Emit: "SELECT :a AS key, 'v' AS value"}
		j := newProc(t, jcfg)
		setup(t, s, j)
		for _, c := range []struct {
			p    *sqlproc.Processor
			line string
			msg  string
		}{
			{p, "a", "1 fields, want 2"},
			{p, "a,1,2", "3 fields, want 2"},
			{p, `"a,1`, "field 1: a quoted field without its closing quote"},
			{p, `a"b,1`, "field 1: a quote in an unquoted field"},
			{j, `{"a":`, "not a JSON document"},
			{j, `{"b":1}`, "no field a ($.a)"},
		} {
			permanent(t, applyItem(t, s, c.p, at(1), line(c.line)), ingest.ReasonMalformed, c.msg)
		}
		if rs := rows(t, s); len(rs) != 0 {
			t.Fatalf("%d outputs from malformed items", len(rs))
		}
	})

	t.Run("Reject", func(t *testing.T) {
		s := openStore(t, nil)
		cfg := csvConfig()
		cfg.Reject = `SELECT CASE WHEN :amount < 0 THEN 'negative' WHEN :amount = 0 THEN NULL END,
			'amount ' || :amount || ' of ' || :account
			WHERE typeof(:amount) <> 'integer' OR :amount <= 0`
		p := newProc(t, cfg)
		setup(t, s, p)
		permanent(t, applyItem(t, s, p, at(1), line("a,-3")), "negative", "amount -3 of a")
		permanent(t, applyItem(t, s, p, at(2), line("a,0")), sqlproc.ReasonRejected, "amount 0 of a")
		if err := applyItem(t, s, p, at(3), line("a,4")); err != nil {
			t.Fatal(err)
		}
		cfg.Reject = "SELECT 'bad' WHERE :amount = 5"
		p = newProc(t, cfg)
		permanent(t, applyItem(t, s, p, at(4), line("a,5")), "bad", "rejected by the reject statement")
		// A reason is cut to 64 bytes, an error to its first line.
		cfg.Reject = "SELECT printf('%.70c', 'r'), 'first line' || char(10) || 'second' WHERE :amount = 6"
		p = newProc(t, cfg)
		permanent(t, applyItem(t, s, p, at(5), line("a,6")), strings.Repeat("r", 64), "first line")
		sameOutputs(t, outputs(t, s), []out{{Position: 3, Topic: "p.out", Key: str("a"), Value: str("4")}})
		if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 4}) {
			t.Fatalf("state = %v", got)
		}
	})

	t.Run("ErrConstraint", func(t *testing.T) {
		s := openStore(t, nil)
		cfg := csvConfig()
		cfg.Setup = `CREATE TABLE IF NOT EXISTS acct (account TEXT PRIMARY KEY);
			CREATE TABLE IF NOT EXISTS t (account TEXT PRIMARY KEY REFERENCES acct(account), n INTEGER NOT NULL CHECK (n < 100)) STRICT;
			CREATE TABLE IF NOT EXISTS log (account TEXT, n INTEGER);
			CREATE TRIGGER IF NOT EXISTS no_z BEFORE INSERT ON t WHEN new.account = 'z' BEGIN SELECT RAISE(ABORT, 'no z'); END;
			INSERT INTO acct VALUES ('a'), ('b'), ('z')`
		// The first statement's write must go when the second fails.
		cfg.Apply = "INSERT INTO log VALUES (:account, :amount); INSERT INTO t VALUES (:account, :amount)"
		p := newProc(t, cfg)
		setup(t, s, p)
		if err := applyItem(t, s, p, at(1), line("a,1")); err != nil {
			t.Fatal(err)
		}
		for i, c := range []struct{ line, msg string }{
			{"a,2", "apply statement 2 (INSERT INTO t VALUES (:account, :amount)): constraint failed: UNIQUE constraint failed: t.account (1555)"},
			{"b,100", "apply statement 2 (INSERT INTO t VALUES (:account, :amount)): constraint failed: CHECK constraint failed: n < 100 (275)"},
			{"b,x", "apply statement 2 (INSERT INTO t VALUES (:account, :amount)): constraint failed: cannot store TEXT value in INTEGER column t.n (3091)"},
			{"c,1", "apply statement 2 (INSERT INTO t VALUES (:account, :amount)): constraint failed: FOREIGN KEY constraint failed (787)"},
			{"z,1", "apply statement 2 (INSERT INTO t VALUES (:account, :amount)): constraint failed: no z (1811)"},
		} {
			permanent(t, applyItem(t, s, p, at(int64(i+2)), line(c.line)), sqlproc.ReasonConstraint, c.msg)
		}
		if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 1}) {
			t.Fatalf("state = %v", got)
		}
		var logged int
		if err := outboxtest.Get(context.Background(), s, &logged, "SELECT count(*) FROM log"); err != nil || logged != 1 {
			t.Fatalf("log rows = %d, %v; want 1: a failed item's first statement stood", logged, err)
		}
		sameOutputs(t, outputs(t, s), []out{{Position: 1, Topic: "p.out", Key: str("a"), Value: str("1")}})
	})

	t.Run("ErrSQL", func(t *testing.T) {
		s := openStore(t, nil)
		p := newProc(t, sqlproc.Config{Name: "p", Input: sqlproc.InputRaw, Topic: "p.out",
			Emit: "SELECT 'k' AS key, json_extract(:value, '$.a') || abs(json_extract(:value, '$.n')) AS value"})
		setup(t, s, p)
		permanent(t, applyItem(t, s, p, at(1), line("not json")), sqlproc.ReasonSQLError,
			"emit (SELECT 'k' AS key, json_extract(:value, '$.a') | ...): SQL logic error: malformed JSON (1)")
		permanent(t, applyItem(t, s, p, at(2), line(`{"a":"x","n":-9223372036854775808}`)), sqlproc.ReasonSQLError,
			"emit (SELECT 'k' AS key, json_extract(:value, '$.a') | ...): SQL logic error: integer overflow (1)")
		if err := applyItem(t, s, p, at(3), line(`{"a":"x","n":-2}`)); err != nil {
			t.Fatal(err)
		}
		sameOutputs(t, outputs(t, s), []out{{Position: 3, Topic: "p.out", Key: str("k"), Value: str("x2")}})
	})

	t.Run("Outputs", func(t *testing.T) {
		s := openStore(t, nil)
		p := newProc(t, sqlproc.Config{Name: "p", Input: sqlproc.InputRaw, Topic: "default.out",
			Emit: `SELECT column1 AS topic, column2 AS key, column3 AS value, column4 AS headers FROM (VALUES
				('a', 'k1', 'v1', NULL),
				(NULL, NULL, x'00ff', '{"h1":"x","h0":"y"}'),
				('c', x'6b', 12, '{}'),
				('d', '', '', NULL),
				('e', 'k', NULL, NULL)) WHERE :value = 'go'`})
		setup(t, s, p)
		if err := applyItem(t, s, p, at(1), line("go")); err != nil {
			t.Fatal(err)
		}
		if err := applyItem(t, s, p, at(2), line("no rows")); err != nil {
			t.Fatal(err)
		}
		sameOutputs(t, outputs(t, s), []out{
			{Position: 1, N: 0, Topic: "a", Key: str("k1"), Value: str("v1")},
			{Position: 1, N: 1, Topic: "default.out", Value: str("\x00\xff"), Headers: []outbox.Header{{Key: "h1", Value: []byte("x")}, {Key: "h0", Value: []byte("y")}}},
			{Position: 1, N: 2, Topic: "c", Key: str("k"), Value: str("12")},
			{Position: 1, N: 3, Topic: "d", Key: str(""), Value: str("")},
			{Position: 1, N: 4, Topic: "e", Key: str("k")},
		})
	})

	t.Run("EmitReturning", func(t *testing.T) {
		// One statement both writes and emits; a failing row still undoes it.
		s := openStore(t, nil)
		cfg := csvConfig()
		cfg.Apply = ""
		cfg.Emit = `INSERT INTO t VALUES (:account, :amount) ON CONFLICT (account) DO UPDATE SET n = n + excluded.n
			RETURNING account AS key, iif(n > 10, 1.5, CAST(n AS TEXT)) AS value`
		p := newProc(t, cfg)
		setup(t, s, p)
		for i, l := range []string{"a,5", "a,2"} {
			if err := applyItem(t, s, p, at(int64(i+1)), line(l)); err != nil {
				t.Fatal(err)
			}
		}
		permanent(t, applyItem(t, s, p, at(3), line("a,4")), sqlproc.ReasonBadOutput,
			"emit (INSERT INTO t VALUES (:account, :amount) ON CONF ...): row 1: value: 1.5 is REAL: CAST it to TEXT or use printf()")
		sameOutputs(t, outputs(t, s), []out{
			{Position: 1, Topic: "p.out", Key: str("a"), Value: str("5")},
			{Position: 2, Topic: "p.out", Key: str("a"), Value: str("7")},
		})
		if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 7}) {
			t.Fatalf("state = %v", got)
		}
	})

	t.Run("ErrBadOutput", func(t *testing.T) {
		s := openStore(t, nil)
		emit := func(row string) *sqlproc.Processor {
			return newProc(t, sqlproc.Config{Name: "p", Input: sqlproc.InputRaw,
				Emit: "SELECT column1 AS topic, 'k' AS key, column2 AS value, column3 AS headers FROM (VALUES ('ok', 'first', NULL), " + row + ")"})
		}
		for _, c := range []struct{ row, msg string }{
			{"(NULL, 'v', NULL)", "emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: the topic is NULL and the processor has no default topic"},
			{"('', 'v', NULL)", "emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: topic  is not a topic name"},
			{"(7, 'v', NULL)", "emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: topic 7 is not a topic name"},
			{"('t', 1.5, NULL)", "emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: value: 1.5 is REAL: CAST it to TEXT or use printf()"},
			{"('t', 'v', '[1]')", "emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: headers: not a JSON object"},
			{"('t', 'v', '{\"a\":1}')", `emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: headers: the value of "a" is not a string`},
			{"('t', 'v', '{\"a\":\"1\"} {}')", "emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: headers: not one JSON object"},
			{"('t', 'v', 3)", "emit (SELECT column1 AS topic, 'k' AS key, column2 AS ...): row 2: headers: 3 is not a JSON object"},
		} {
			p := emit(c.row)
			setup(t, s, p)
			permanent(t, applyItem(t, s, p, at(1), line("x")), sqlproc.ReasonBadOutput, c.msg)
		}
		if rs := rows(t, s); len(rs) != 0 {
			t.Fatalf("%d outputs kept from items with a bad output", len(rs))
		}
	})
}

// TestProcessor_Transient makes statements fail for real with errors a
// retry can outlive: each is transient (not a dead letter), leaves nothing
// of the item, and the next attempt applies it.
//
// SQLITE_BUSY itself cannot reach a statement: the store begins every
// transaction IMMEDIATE, which takes the write lock of the database and of
// every attached one at BEGIN, so a lock held elsewhere fails the BEGIN (a
// batch retry of the loop), never a statement. What does reach one is a
// table lock of a shared cache, which the driver waits out until the
// attempt's deadline; TestClassify has the real SQLITE_BUSY.
func TestProcessor_Transient(t *testing.T) {
	ctx := context.Background()
	t.Run("DiskFull", func(t *testing.T) {
		s := openStore(t, nil)
		cfg := csvConfig()
		cfg.Setup += "; CREATE TABLE IF NOT EXISTS blobs (b BLOB)"
		cfg.Apply = "INSERT INTO blobs VALUES (zeroblob(:amount)); " + cfg.Apply
		p := newProc(t, cfg)
		setup(t, s, p)
		var pages int64
		if err := outboxtest.Get(ctx, s, &pages, "PRAGMA page_count"); err != nil {
			t.Fatal(err)
		}
		if _, err := outboxtest.Exec(ctx, s, fmt.Sprintf("PRAGMA max_page_count = %d", pages+2)); err != nil {
			t.Fatal(err)
		}
		// SQLite answers SQLITE_FULL by rolling back the whole transaction,
		// not just the statement: the item's savepoint is gone with it, and
		// the loop retries the batch. Nothing of the item stays.
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.BeginItem(at(1).Place()); err != nil {
			t.Fatal(err)
		}
		err = p.Apply(ctx, tx, at(1), line("a,1000000"))
		var se *sqlite.Error
		if _, perm := ingest.IsPermanent(err); perm || !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_FULL {
			t.Fatalf("Apply on a full database = %v, want a transient SQLITE_FULL", err)
		}
		if err := tx.RollbackItem(); err == nil {
			t.Fatal("the savepoint outlived SQLITE_FULL: SQLite rolls back the transaction")
		}
		tx.Rollback()
		if rs := rows(t, s); len(rs) != 0 {
			t.Fatalf("%d outputs from an item that failed", len(rs))
		}
		if got := counts(t, s, "t"); len(got) != 0 {
			t.Fatalf("state = %v after a failed item", got)
		}
		if _, err := outboxtest.Exec(ctx, s, "PRAGMA max_page_count = 1000000"); err != nil {
			t.Fatal(err)
		}
		d := at(1)
		d.Attempt = 2
		if err := applyItem(t, s, p, d, line("a,1000000")); err != nil {
			t.Fatal(err)
		}
		sameOutputs(t, outputs(t, s), []out{{Position: 1, Topic: "p.out", Key: str("a"), Value: str("1000000")}})
	})

	t.Run("TableLocked", func(t *testing.T) {
		s := openStore(t, nil)
		other, lock := lockedTable(t, s)
		p := newProc(t, csvConfig())
		actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		err := applyItemCtx(t, actx, s, p, at(1), line("a,5"))
		if _, perm := ingest.IsPermanent(err); perm || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Apply while another connection reads the table = %v, want the attempt's deadline", err)
		}
		lock()
		d := at(1)
		d.Attempt = 2
		if err := applyItem(t, s, p, d, line("a,5")); err != nil {
			t.Fatal(err)
		}
		sameOutputs(t, outputs(t, s), []out{{Position: 1, Topic: "p.out", Key: str("a"), Value: str("5")}})
		var n int
		if err := other.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
			t.Fatalf("aux.t has %d rows, %v; want 1", n, err)
		}
	})
}

// lockedTable attaches to s's writer connection a shared-cache database
// holding the table t of csvConfig, so that the processor's unqualified t
// is aux.t (main has none: Setup, which would make it, is not run), and
// holds a read lock on it from another connection until unlock is called.
func lockedTable(t *testing.T, s *outbox.Store) (other *sql.DB, unlock func()) {
	t.Helper()
	ctx := context.Background()
	uri := fmt.Sprintf("file:%s?mode=memory&cache=shared", filepath.Base(t.TempDir()))
	other, err := sql.Open("sqlite", uri)
	if err != nil {
		t.Fatal(err)
	}
	other.SetMaxOpenConns(1) // the memory database lives while its connection does
	t.Cleanup(func() { other.Close() })
	if _, err := other.Exec("CREATE TABLE t (account TEXT PRIMARY KEY, n INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtest.Exec(ctx, s, "ATTACH DATABASE ? AS aux", uri); err != nil {
		t.Fatal(err)
	}
	reader, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := reader.Query("SELECT * FROM t")
	if err != nil {
		t.Fatal(err)
	}
	var once bool
	return other, func() {
		if !once {
			once = true
			rs.Close()
			reader.Rollback()
		}
	}
}

// TestProcessor_GuardAtRunTime: a trigger Check never saw (made on the
// processor's table by someone else: an operator with sqlite3, another
// processor's setup) that writes outboxd's tables is refused when the
// processor's statement fires it: the item is a dead letter, nothing is
// written.
func TestProcessor_GuardAtRunTime(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, nil)
	p := newProc(t, csvConfig())
	setup(t, s, p)
	if err := applyItem(t, s, p, at(1), line("a,1")); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtest.Exec(ctx, s, `CREATE TRIGGER sneaky AFTER UPDATE ON t BEGIN
		DELETE FROM positions; INSERT INTO outbox (feed, partition, epoch, position, n, topic, created_at) VALUES ('x', 0, 'e', 0, 0, 'x', 0); END`); err != nil {
		t.Fatal(err)
	}
	permanent(t, applyItem(t, s, p, at(2), line("a,1")), sqlproc.ReasonForbidden,
		"apply (INSERT INTO t VALUES (:account, :amount) ON CONF ...): authorization denied: not authorized (23)")
	sameOutputs(t, outputs(t, s), []out{{Position: 1, Topic: "p.out", Key: str("a"), Value: str("1")}})
	if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 1}) {
		t.Fatalf("state = %v", got)
	}

	// The guard refuses temporary objects that would hide outboxd's
	// tables, and triggers on them, whoever compiles them on the store.
	for _, q := range []string{
		"CREATE TEMP TABLE outbox (x)",
		"CREATE TEMP VIEW positions AS SELECT 1",
		"CREATE TRIGGER t2 AFTER INSERT ON outbox BEGIN SELECT 1; END",
		"CREATE TEMP TRIGGER t3 AFTER DELETE ON feeds BEGIN SELECT 1; END",
	} {
		if _, err := outboxtest.Exec(ctx, s, q); err == nil {
			t.Errorf("%s: the guard let it through", q)
		}
	}
}

func TestProcessor_Setup(t *testing.T) {
	t.Run("ErrNoGuard", func(t *testing.T) {
		s := openStore(t, nil, true)
		p := newProc(t, csvConfig())
		want := "sqlproc p: the store has no SQL guard: call sqlproc.Guard after opening it"
		err := inTx(t, s, func(tx *outbox.Tx) error { return p.Setup(context.Background(), tx) })
		if err == nil || err.Error() != want {
			t.Fatalf("Setup = %v, want %s", err, want)
		}
		if err := applyItem(t, s, p, at(1), line("a,1")); err == nil || err.Error() != want {
			t.Fatalf("Apply = %v, want %s", err, want)
		}
		if err := sqlproc.Guard(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		setup(t, s, p)
	})

	t.Run("Twice", func(t *testing.T) {
		s := openStore(t, nil)
		p := newProc(t, csvConfig())
		setup(t, s, p)
		if err := applyItem(t, s, p, at(1), line("a,1")); err != nil {
			t.Fatal(err)
		}
		setup(t, newStoreSame(t, s), p) // a restart: setup runs again on the same database
		if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 1}) {
			t.Fatalf("state after setup ran again = %v", got)
		}
	})

	t.Run("ErrSchemaDiffers", func(t *testing.T) {
		// An earlier version of the processor left a table t without n:
		// CREATE TABLE IF NOT EXISTS keeps it, and the start fails.
		s := openStore(t, nil)
		if _, err := outboxtest.Exec(context.Background(), s, "CREATE TABLE t (account TEXT PRIMARY KEY, total INTEGER)"); err != nil {
			t.Fatal(err)
		}
		p := newProc(t, csvConfig())
		err := inTx(t, s, func(tx *outbox.Tx) error { return p.Setup(context.Background(), tx) })
		want := "sqlproc p: apply (INSERT INTO t VALUES (:account, :amount) ON CONF ...): no such column: n"
		if err == nil || err.Error() != want {
			t.Fatalf("Setup = %v, want %s", err, want)
		}
	})
}

// newStoreSame is the store s, opened again (as after a restart), guarded.
func newStoreSame(t *testing.T, s *outbox.Store) *outbox.Store {
	t.Helper()
	s2 := outboxtest.StoreAt(t, s.Path())
	if err := sqlproc.Guard(context.Background(), s2); err != nil {
		t.Fatal(err)
	}
	return s2
}
