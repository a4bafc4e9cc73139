package pgtable_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/pgtable"
)

var _ sink.Target = (*pgtable.Target)(nil)

var t0 = time.Date(2026, 12, 6, 12, 0, 0, 123456000, time.UTC)

// row is output id: key k<id%keys>, a JSON value naming the id, one
// header.
func row(id int64, keys int) outbox.Row {
	return outbox.Row{
		ID: id, Feed: "f", Partition: 0, Epoch: "e1", Position: id * 10, N: 0, Topic: "t",
		Key:       []byte(fmt.Sprintf("k%d", id%int64(keys))),
		Value:     []byte(fmt.Sprintf(`{"id": %d}`, id)),
		Headers:   outbox.EncodeHeaders([]outbox.Header{{Key: "h", Value: []byte(fmt.Sprintf("v%d", id))}}),
		CreatedAt: t0.Add(time.Duration(id) * time.Second).UnixNano(),
	}
}

func rows(from, to int64, keys int) []outbox.Row {
	var out []outbox.Row
	for id := from; id <= to; id++ {
		out = append(out, row(id, keys))
	}
	return out
}

func open(t *testing.T, cfg pgtable.Config) *pgtable.Target {
	t.Helper()
	if cfg.Sink == "" {
		cfg.Sink = "pg"
	}
	tg, err := pgtable.Open(context.Background(), cfg)
	testutil.Must(t, err)
	t.Cleanup(func() { tg.Close() })
	return tg
}

func resume(t *testing.T, tg *pgtable.Target) int64 {
	t.Helper()
	id, err := tg.Resume(context.Background())
	testutil.Must(t, err)
	return id
}

// deliver delivers rs and fails the test on an error or a dead letter.
func deliver(t *testing.T, tg *pgtable.Target, rs []outbox.Row) {
	t.Helper()
	if dls := deliverDead(t, tg, rs); len(dls) != 0 {
		t.Fatalf("unexpected dead letters: %+v", dls)
	}
}

// deliverDead delivers rs and returns the dead letters.
func deliverDead(t *testing.T, tg *pgtable.Target, rs []outbox.Row) []outbox.RowDeadLetter {
	t.Helper()
	dls, err := tg.Deliver(context.Background(), rs)
	testutil.Must(t, err)
	return dls
}

// stored is one row of an output table as read back.
type stored struct {
	ID        int64
	Key       []byte
	Value     string
	Headers   string
	Feed      string
	Partition int32
	Epoch     string
	Position  int64
	Topic     string
	CreatedAt time.Time
}

func readTable(t *testing.T, c *pgx.Conn, table string) []stored {
	t.Helper()
	rs, err := c.Query(context.Background(), `SELECT outbox_id, key, value::text, coalesce(headers::text, ''), feed, partition, epoch, position, topic, created_at FROM `+table+` ORDER BY outbox_id`)
	testutil.Must(t, err)
	defer rs.Close()
	var out []stored
	for rs.Next() {
		var s stored
		testutil.Must(t, rs.Scan(&s.ID, &s.Key, &s.Value, &s.Headers, &s.Feed, &s.Partition, &s.Epoch, &s.Position, &s.Topic, &s.CreatedAt))
		out = append(out, s)
	}
	testutil.Must(t, rs.Err())
	return out
}

func want(r outbox.Row) stored {
	var v any
	if err := json.Unmarshal(r.Value, &v); err != nil {
		panic(err)
	}
	hs, _ := outbox.DecodeHeaders(r.Headers)
	h := fmt.Sprintf(`[{"key": "%s", "value": "%s"}]`, hs[0].Key, hs[0].Value)
	return stored{ID: r.ID, Key: r.Key, Value: fmt.Sprintf(`{"id": %d}`, r.ID), Headers: h, Feed: r.Feed, Partition: r.Partition,
		Epoch: r.Epoch, Position: r.Position, Topic: r.Topic, CreatedAt: time.Unix(0, r.CreatedAt)}
}

func checkTable(t *testing.T, c *pgx.Conn, table string, wantRows []outbox.Row) {
	t.Helper()
	got := readTable(t, c, table)
	if len(got) != len(wantRows) {
		t.Fatalf("%s holds %d rows, want %d", table, len(got), len(wantRows))
	}
	for i, r := range wantRows {
		w, g := want(r), got[i]
		if g.ID != w.ID || !bytes.Equal(g.Key, w.Key) || g.Value != w.Value || g.Headers != w.Headers || g.Feed != w.Feed ||
			g.Partition != w.Partition || g.Epoch != w.Epoch || g.Position != w.Position || g.Topic != w.Topic || !g.CreatedAt.Equal(w.CreatedAt) {
			t.Fatalf("%s row %d:\n got %+v\nwant %+v", table, i, g, w)
		}
	}
}

func TestDeliver_ExactRows(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	tg := open(t, pgtable.Config{DSN: db.DSN, Create: true, Tables: map[string]string{"other": "public.other_outputs"}})
	testutil.Equal(t, "Resume of a new sink", resume(t, tg), int64(0))
	all := rows(1, 250, 1000)
	for i := range all {
		if i%3 == 0 {
			all[i].Topic = "other"
		}
	}
	for _, b := range [][2]int{{0, 1}, {1, 100}, {100, 250}} {
		deliver(t, tg, all[b[0]:b[1]])
	}
	testutil.Equal(t, "Resume", resume(t, tg), int64(250))
	var main, other []outbox.Row
	for _, r := range all {
		if r.Topic == "other" {
			other = append(other, r)
		} else {
			main = append(main, r)
		}
	}
	checkTable(t, c, "outboxd_outputs", main)
	checkTable(t, c, "other_outputs", other)
	// A row without key, value or headers.
	bare := outbox.Row{ID: 251, Feed: "f", Epoch: "e", Position: 1, Topic: "t", Value: []byte("null"), CreatedAt: t0.UnixNano()}
	deliver(t, tg, []outbox.Row{bare})
	var key []byte
	var value, headers *string
	testutil.Must(t, c.QueryRow(context.Background(), `SELECT key, value::text, headers::text FROM outboxd_outputs WHERE outbox_id = 251`).Scan(&key, &value, &headers))
	if key != nil || value == nil || *value != "null" || headers != nil {
		t.Fatalf("bare row: key %q value %v headers %v, want NULL, null, NULL", key, value, headers)
	}
}

func TestDeliver_CrashBetweenDeliverAndStoredProgress(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	cfg := pgtable.Config{DSN: db.DSN, Create: true}
	tg := open(t, cfg)
	resume(t, tg)
	deliver(t, tg, rows(1, 10, 1000))
	// The process dies before the runner stores its progress (0): a new
	// one learns from the table where it stands.
	tg.Close()
	tg2 := open(t, cfg)
	testutil.Equal(t, "Resume after the crash", resume(t, tg2), int64(10))
	deliver(t, tg2, rows(11, 15, 1000))
	// Rows the progress row covers are never written twice, even when
	// delivered again.
	deliver(t, tg2, rows(5, 20, 1000))
	checkTable(t, c, "outboxd_outputs", rows(1, 20, 1000))
	testutil.Equal(t, "Resume", resume(t, tg2), int64(20))
}

func TestDeliver_UpsertKeepsLast(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	tg := open(t, pgtable.Config{DSN: db.DSN, Create: true, Mode: pgtable.Upsert})
	resume(t, tg)
	// 7 keys, each several times in one batch and across batches.
	deliver(t, tg, rows(1, 30, 7))
	deliver(t, tg, rows(31, 40, 7))
	deliver(t, tg, rows(20, 41, 7)) // 20..40 delivered before: only 41 is new
	var lastOf []outbox.Row
	for id := int64(35); id <= 41; id++ {
		lastOf = append(lastOf, row(id, 7))
	}
	checkTable(t, c, "outboxd_outputs", lastOf)
	var n int
	testutil.Must(t, c.QueryRow(context.Background(), `SELECT count(*) FROM outboxd_outputs`).Scan(&n))
	testutil.Equal(t, "rows", n, 7)

	// An output without a key cannot be upserted: a dead letter.
	nokey := row(42, 7)
	nokey.Key = nil
	dls := deliverDead(t, tg, []outbox.Row{nokey, row(43, 7)})
	if len(dls) != 1 || dls[0].Row.ID != 42 || dls[0].Reason != pgtable.ReasonNoKey {
		t.Fatalf("dead letters %+v, want row 42 no-key", dls)
	}
}

func TestDeliver_NotJSONIsADeadLetterOthersGoOn(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	cfg := pgtable.Config{DSN: db.DSN, Create: true}
	tg := open(t, cfg)
	resume(t, tg)
	batch := rows(1, 6, 1000)
	batch[1].Value = []byte("not json")
	batch[3].Value = []byte(`"a\u0000b"`) // JSON, but jsonb holds no NUL: PostgreSQL refuses it
	dls := deliverDead(t, tg, batch)
	check := func(dls []outbox.RowDeadLetter) {
		t.Helper()
		if len(dls) != 2 {
			t.Fatalf("%d dead letters %+v, want 2", len(dls), dls)
		}
		if dls[0].Row.ID != 2 || dls[0].Reason != pgtable.ReasonNotJSON || !bytes.Equal(dls[0].Row.Value, []byte("not json")) {
			t.Fatalf("dead letter 0: %+v", dls[0])
		}
		if dls[1].Row.ID != 4 || dls[1].Reason != pgtable.ReasonRefused || !strings.Contains(dls[1].Error, "unsupported Unicode escape") {
			t.Fatalf("dead letter 1: %+v", dls[1])
		}
	}
	check(dls)
	good := []outbox.Row{batch[0], batch[2], batch[4], batch[5]}
	checkTable(t, c, "outboxd_outputs", good)

	// A crash before the runner stored the dead letters: Resume goes back
	// before the oldest refusal, and delivering again returns them again
	// without writing anything twice.
	tg.Close()
	tg = open(t, cfg)
	testutil.Equal(t, "Resume with refusals kept", resume(t, tg), int64(1))
	check(deliverDead(t, tg, batch[1:]))
	checkTable(t, c, "outboxd_outputs", good)

	// Rows after them show the runner stored them: forgotten.
	deliver(t, tg, rows(7, 7, 1000))
	testutil.Equal(t, "Resume", resume(t, tg), int64(7))

	// The runner's screen finds the not-JSON one before delivery.
	keep, refused := tg.Screen(batch)
	if len(keep) != 5 || len(refused) != 1 || refused[0].Row.ID != 2 {
		t.Fatalf("Screen: keep %d refused %+v", len(keep), refused)
	}
}

func TestDeliver_DatabaseDownThenUp(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	proxy, dsn := db.NewProxy(t)
	tg := open(t, pgtable.Config{DSN: dsn, Create: true})
	resume(t, tg)
	deliver(t, tg, rows(1, 100, 1000))
	proxy.Down()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := tg.Deliver(ctx, rows(101, 200, 1000)); err == nil {
		t.Fatal("Deliver with the database down succeeded")
	}
	if _, err := tg.Resume(ctx); err == nil {
		t.Fatal("Resume with the database down succeeded")
	}
	proxy.Up()
	var pos int64
	testutil.Wait(t, 20*time.Second, func() error {
		var err error
		pos, err = tg.Resume(context.Background())
		return err
	})
	testutil.Equal(t, "Resume after the database came back", pos, int64(100))
	deliver(t, tg, rows(pos+1, 200, 1000))
	checkTable(t, c, "outboxd_outputs", rows(1, 200, 1000))
}

func TestDeliver_TwoProcessesOneSink(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	cfg := pgtable.Config{DSN: db.DSN, Create: true}
	a, b := open(t, cfg), open(t, cfg)
	resume(t, a)
	resume(t, b)
	var wg sync.WaitGroup
	for _, tg := range []*pgtable.Target{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := int64(1); from <= 500; from += 50 {
				if _, err := tg.Deliver(context.Background(), rows(from, from+49, 1000)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	checkTable(t, c, "outboxd_outputs", rows(1, 500, 1000))
}

func TestValueTypes(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	ctx := context.Background()
	b := open(t, pgtable.Config{DSN: db.DSN, Sink: "b", Create: true, Value: pgtable.Bytea, Table: "b"})
	a := open(t, pgtable.Config{DSN: db.DSN, Sink: "a", Create: true, Value: pgtable.Auto, Table: "a"})
	batch := rows(1, 3, 1000)
	batch[1].Value = []byte("not json \xff")
	batch[2].Value = []byte{}
	for _, tg := range []*pgtable.Target{a, b} {
		resume(t, tg)
		deliver(t, tg, batch)
	}
	for i, r := range batch {
		var raw []byte
		testutil.Must(t, c.QueryRow(ctx, `SELECT value FROM b WHERE outbox_id = $1`, r.ID).Scan(&raw))
		if !bytes.Equal(raw, r.Value) {
			t.Fatalf("bytea row %d: %q, want %q", i, raw, r.Value)
		}
		var js *string
		var bs []byte
		testutil.Must(t, c.QueryRow(ctx, `SELECT value::text, value_bytes FROM a WHERE outbox_id = $1`, r.ID).Scan(&js, &bs))
		switch i {
		case 0:
			if js == nil || *js != `{"id": 1}` || bs != nil {
				t.Fatalf("auto row 0: %v %q", js, bs)
			}
		default:
			if js != nil || !bytes.Equal(bs, r.Value) || bs == nil {
				t.Fatalf("auto row %d: %v %q, want NULL and %q", i, js, bs, r.Value)
			}
		}
	}
}

func TestResume_ChecksAnExistingTable(t *testing.T) {
	db := pgtest.New(t)
	c := db.Conn(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, ddl string
		cfg       pgtable.Config
		err       string
	}{
		{"missing", ``, pgtable.Config{Table: "nope"}, "table nope does not exist"},
		{"wrong type", `CREATE TABLE wrong (outbox_id bigint PRIMARY KEY, key bytea, value text, headers jsonb, feed text, partition int, epoch text, position bigint, topic text)`,
			pgtable.Config{Table: "wrong"}, "wrong: value is text, want jsonb; created_at missing"},
		{"no unique key", `CREATE TABLE nokey (outbox_id bigint, key bytea, value jsonb, headers jsonb, feed text, partition int, epoch text, position bigint, topic text, created_at timestamptz)`,
			pgtable.Config{Table: "nokey", Mode: pgtable.Upsert}, "an upsert needs a unique index on key alone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ddl != "" {
				_, err := c.Exec(ctx, tc.ddl)
				testutil.Must(t, err)
			}
			tc.cfg.DSN = db.DSN
			tg := open(t, tc.cfg)
			_, err := tg.Resume(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Resume: %v, want %q", err, tc.err)
			}
		})
	}
	// A table made by hand with the columns works.
	_, err := c.Exec(ctx, `CREATE TABLE mine (outbox_id bigint PRIMARY KEY, key bytea, value jsonb, headers jsonb, feed text, partition int, epoch text, position bigint, topic text, created_at timestamptz, extra text DEFAULT 'x')`)
	testutil.Must(t, err)
	tg := open(t, pgtable.Config{DSN: db.DSN, Table: "mine"})
	resume(t, tg)
	deliver(t, tg, rows(1, 3, 1000))
	checkTable(t, c, "mine", rows(1, 3, 1000))
}

func TestConfig_Check(t *testing.T) {
	for _, tc := range []struct {
		cfg pgtable.Config
		err string
	}{
		{pgtable.Config{DSN: "postgres://x/y"}, "no sink name"},
		{pgtable.Config{Sink: "s", DSN: "postgres://x/y", Mode: "merge"}, `mode "merge"`},
		{pgtable.Config{Sink: "s", DSN: "postgres://x/y", Value: "xml"}, `value "xml"`},
		{pgtable.Config{Sink: "s", DSN: "postgres://x/y", Table: "a.b.c"}, `want TABLE or SCHEMA.TABLE`},
		{pgtable.Config{Sink: "s", DSN: "postgres://x/y", Tables: map[string]string{"t": "bad-name"}}, `"bad-name"`},
		{pgtable.Config{Sink: "s", DSN: "host=x port=notaport"}, "DSN"},
	} {
		err := tc.cfg.Check()
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("Check(%+v) = %v, want %q", tc.cfg, err, tc.err)
		}
	}
	testutil.Must(t, pgtable.Config{Sink: "s", DSN: "postgres://x/y", Table: "s.t"}.Check())
}

func TestConfigFrom(t *testing.T) {
	c, err := pgtable.ConfigFrom("s", "postgres://x/y", map[string]string{"a": "ta", "b": ""},
		map[string]string{"mode": "upsert", "value": "bytea", "create": "false", "table": "main", "max_conns": "3"})
	testutil.Must(t, err)
	if c.Mode != pgtable.Upsert || c.Value != pgtable.Bytea || c.Create || c.Table != "main" || c.MaxConns != 3 ||
		len(c.Tables) != 1 || c.Tables["a"] != "ta" || c.Sink != "s" || c.DSN != "postgres://x/y" {
		t.Fatalf("ConfigFrom: %+v", c)
	}
	c, err = pgtable.ConfigFrom("s", "postgres://x/y", nil, nil)
	testutil.Must(t, err)
	testutil.Equal(t, "create by default", c.Create, true)
	for opts, want := range map[string]string{
		"colour=red":  `option "colour": a PostgreSQL sink reads table, mode`,
		"create=yes!": `option create: "yes!": want true or false`,
		"mode=merge":  `mode "merge"`,
		"max_conns=0": `option max_conns: "0"`,
	} {
		k, v, _ := strings.Cut(opts, "=")
		if _, err := pgtable.ConfigFrom("s", "postgres://x/y", nil, map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ConfigFrom(%s) = %v, want %q", opts, err, want)
		}
	}
}
