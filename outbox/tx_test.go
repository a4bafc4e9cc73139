package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
)

func place(feed string, pos int64) outbox.Place {
	return outbox.Place{Feed: feed, Partition: 0, Epoch: "e", Position: pos}
}

func out(topic, key, value string) outbox.Output {
	return outbox.Output{Topic: topic, Key: []byte(key), Value: []byte(value)}
}

// emit commits one transaction holding one item at p that emits outs.
func emit(t *testing.T, s *outbox.Store, p outbox.Place, outs ...outbox.Output) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tx.BeginItem(p); err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		if err := tx.Emit(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.EndItem(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// allRows reads the whole outbox, checking that ids strictly increase.
func allRows(t *testing.T, s *outbox.Store) []outbox.Row {
	t.Helper()
	rows, err := s.Rows(context.Background(), 0, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(rows); i++ {
		if rows[i].ID <= rows[i-1].ID {
			t.Fatalf("outbox ids not increasing: %d after %d", rows[i].ID, rows[i-1].ID)
		}
	}
	return rows
}

// rowPlace is the part of a row a test compares exactly.
type rowPlace struct {
	ID        int64
	Feed      string
	Partition int32
	Epoch     string
	Position  int64
	N         int
	Topic     string
	Key       string
	Value     string
}

func places(rows []outbox.Row) []rowPlace {
	var ps []rowPlace
	for _, r := range rows {
		ps = append(ps, rowPlace{r.ID, r.Feed, r.Partition, r.Epoch, r.Position, r.N, r.Topic, string(r.Key), string(r.Value)})
	}
	return ps
}

func samePlaces(t *testing.T, got []outbox.Row, want []rowPlace) {
	t.Helper()
	if g := places(got); !slices.Equal(g, want) {
		t.Fatalf("rows:\n got %+v\nwant %+v", g, want)
	}
}

func begin(t *testing.T, s *outbox.Store) *outbox.Tx {
	t.Helper()
	tx, err := s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	return tx
}

// must is testutil.Must.
var must = testutil.Must

func TestTx_Emit(t *testing.T) {
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		s, clk := openStore(t)
		tx := begin(t, s)
		p1 := outbox.Place{Feed: "f", Partition: 3, Epoch: "ep1", Position: 10}
		p2 := outbox.Place{Feed: "g", Partition: 0, Epoch: "ep2", Position: 20}
		must(t, tx.BeginItem(p1))
		hs := []outbox.Header{{Key: "h", Value: []byte{0, 1, 2}}}
		must(t, tx.Emit(ctx, outbox.Output{Topic: "a", Key: []byte("k0"), Value: []byte("v0"), Headers: hs}))
		must(t, tx.Emit(ctx, out("b", "k1", "v1")))
		must(t, tx.Emit(ctx, out("a", "k2", "v2")))
		must(t, tx.EndItem())
		equal(t, "Emitted()", tx.Emitted(), 3)
		created := clk.Add(1)
		must(t, tx.BeginItem(p2))
		must(t, tx.Emit(ctx, out("c", "k3", "v3")))
		must(t, tx.EndItem())
		equal(t, "Emitted()", tx.Emitted(), 4)
		must(t, tx.Commit())

		rows := allRows(t, s)
		samePlaces(t, rows, []rowPlace{
			{1, "f", 3, "ep1", 10, 0, "a", "k0", "v0"},
			{2, "f", 3, "ep1", 10, 1, "b", "k1", "v1"},
			{3, "f", 3, "ep1", 10, 2, "a", "k2", "v2"},
			{4, "g", 0, "ep2", 20, 0, "c", "k3", "v3"},
		})
		got, err := outbox.DecodeHeaders(rows[0].Headers)
		must(t, err)
		if len(got) != 1 || got[0].Key != "h" || !bytes.Equal(got[0].Value, []byte{0, 1, 2}) {
			t.Fatalf("headers = %+v", got)
		}
		if rows[1].Headers != nil {
			t.Fatalf("row without headers has headers %x", rows[1].Headers)
		}
		// Rows are written at commit, all with the commit's time.
		equal(t, "created_at of row 3", rows[2].CreatedAt, created.UnixNano())
		equal(t, "created_at of row 4", rows[3].CreatedAt, created.UnixNano())
	})

	t.Run("IDsIncreaseAcrossTransactions", func(t *testing.T) {
		s, _ := openStore(t)
		for i := range int64(5) {
			emit(t, s, place("f", i+1), out("t", "", "a"), out("t", "", "b"))
		}
		rows := allRows(t, s)
		equal(t, "rows", len(rows), 10)
		for i, r := range rows {
			equal(t, "id", r.ID, int64(i+1))
			equal(t, "position", r.Position, int64(i/2+1))
			equal(t, "n", r.N, i%2)
		}
	})

	t.Run("SetPlace", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		tx.SetPlace(place("f", 5))
		must(t, tx.Emit(ctx, out("t", "", "a")))
		must(t, tx.Emit(ctx, out("t", "", "b")))
		tx.SetPlace(place("f", 6))
		must(t, tx.Emit(ctx, out("t", "", "c")))
		must(t, tx.Commit())
		samePlaces(t, allRows(t, s), []rowPlace{
			{1, "f", 0, "e", 5, 0, "t", "", "a"},
			{2, "f", 0, "e", 5, 1, "t", "", "b"},
			{3, "f", 0, "e", 6, 0, "t", "", "c"},
		})
	})

	// 100 rows flush as chunks of 64, 32 and 4. The first chunk's rows
	// differ in topic and epoch in its middle (each value bound per row),
	// the others share their origin (bound once); a second transaction
	// runs the statements the first left prepared.
	t.Run("Chunks", func(t *testing.T) {
		s, _ := openStore(t)
		var want []rowPlace
		id := int64(0)
		for round := range 2 {
			tx := begin(t, s)
			for i := range int64(100) {
				p := outbox.Place{Feed: "f", Partition: 2, Epoch: "e", Position: int64(round)*1000 + i}
				topic := "t"
				if i == 30 {
					p.Epoch, topic = "e2", "u"
				}
				must(t, tx.BeginItem(p))
				key, value := fmt.Sprint("k", i), fmt.Sprint("v", round, "-", i)
				must(t, tx.Emit(ctx, out(topic, key, value)))
				must(t, tx.EndItem())
				id++
				want = append(want, rowPlace{id, "f", 2, p.Epoch, p.Position, 0, topic, key, value})
			}
			must(t, tx.Commit())
		}
		samePlaces(t, allRows(t, s), want)
	})

	t.Run("ErrNoTopic", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		err := tx.Emit(ctx, outbox.Output{Value: []byte("v")})
		if err == nil {
			t.Fatal("no error")
		}
		equal(t, "error", err.Error(), "emit: output has no topic")
		equal(t, "Emitted()", tx.Emitted(), 0)
		// The failed emit took no n: the next output is still n = 0.
		must(t, tx.Emit(ctx, out("t", "", "v")))
		must(t, tx.EndItem())
		must(t, tx.Commit())
		samePlaces(t, allRows(t, s), []rowPlace{{1, "f", 0, "e", 1, 0, "t", "", "v"}})
	})
}

func TestTx_BeginItem(t *testing.T) {
	t.Run("ErrItemOpen", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		err := tx.BeginItem(place("f", 2))
		if err == nil {
			t.Fatal("no error")
		}
		equal(t, "error", err.Error(), "begin item: previous item still open")
	})
}

func TestTx_RollbackItem(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	tx := begin(t, s)
	put := func(k string) {
		t.Helper()
		if _, err := tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES (?, 'x')`, k); err != nil {
			t.Fatal(err)
		}
	}

	must(t, tx.BeginItem(place("f", 1)))
	put("one")
	must(t, tx.Emit(ctx, out("t", "", "1a")))
	must(t, tx.EndItem())

	must(t, tx.BeginItem(place("f", 2)))
	put("two")
	must(t, tx.Emit(ctx, out("t", "", "2a")))
	must(t, tx.Emit(ctx, out("t", "", "2b")))
	equal(t, "Emitted() before rollback", tx.Emitted(), 3)
	must(t, tx.RollbackItem())
	equal(t, "Emitted() after rollback", tx.Emitted(), 1)

	// The same item again, as a retry would do it.
	must(t, tx.BeginItem(place("f", 2)))
	must(t, tx.Emit(ctx, out("t", "", "2c")))
	must(t, tx.EndItem())
	equal(t, "Emitted()", tx.Emitted(), 2)
	must(t, tx.Commit())

	var keys []string
	must(t, outbox.ReadPoolOf(s).Select(&keys, `SELECT key FROM meta ORDER BY key`))
	if !slices.Equal(keys, []string{"one"}) {
		t.Fatalf("state = %q, want [one]", keys)
	}
	// The rolled-back rows were never visible, and the savepoint took their
	// ids back with them: committed ids have no gap.
	samePlaces(t, allRows(t, s), []rowPlace{
		{1, "f", 0, "e", 1, 0, "t", "", "1a"},
		{2, "f", 0, "e", 2, 0, "t", "", "2c"},
	})
}

func TestTx_Commit(t *testing.T) {
	ctx := context.Background()

	t.Run("OnCommitInOrderAfterCommit", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		tx.SetPlace(place("f", 1))
		must(t, tx.Emit(ctx, out("t", "", "v")))
		var calls []string
		for _, name := range []string{"first", "second", "third"} {
			tx.OnCommit(func() {
				// Run after COMMIT: a reader already sees the row.
				rows, err := s.Rows(ctx, 0, 10)
				if err != nil || len(rows) != 1 {
					calls = append(calls, name+" before commit")
					return
				}
				calls = append(calls, name)
			})
		}
		if len(calls) != 0 {
			t.Fatalf("callbacks ran before Commit: %q", calls)
		}
		must(t, tx.Commit())
		if !slices.Equal(calls, []string{"first", "second", "third"}) {
			t.Fatalf("callbacks = %q", calls)
		}
		// Rollback after Commit is a no-op.
		must(t, tx.Rollback())
		equal(t, "rows", len(allRows(t, s)), 1)
	})

	t.Run("ErrTwice", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		ran := 0
		tx.OnCommit(func() { ran++ })
		must(t, tx.Commit())
		err := tx.Commit()
		if err == nil {
			t.Fatal("second Commit: no error")
		}
		equal(t, "error", err.Error(), "commit: transaction already finished")
		equal(t, "callback runs", ran, 1)
	})

	t.Run("RollbackSkipsOnCommit", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		tx.SetPlace(place("f", 1))
		must(t, tx.Emit(ctx, out("t", "", "v")))
		ran := false
		tx.OnCommit(func() { ran = true })
		must(t, tx.Rollback())
		must(t, tx.Rollback())
		if ran {
			t.Fatal("OnCommit ran on rollback")
		}
		equal(t, "rows", len(allRows(t, s)), 0)
		err := tx.Commit()
		if err == nil {
			t.Fatal("Commit after Rollback: no error")
		}
		equal(t, "error", err.Error(), "commit: transaction already finished")
		if ran {
			t.Fatal("OnCommit ran on a failed commit")
		}
	})

	t.Run("ErrCommitHook", func(t *testing.T) {
		s, _ := openStore(t)
		must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
		errHook := errors.New("injected")
		hooked := 0
		s.SetCommitHook(func(context.Context) error { hooked++; return errHook })
		tx := begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		must(t, tx.Emit(ctx, out("t", "", "v")))
		must(t, tx.EndItem())
		must(t, tx.SetPosition(ctx, "f", outbox.Checkpoint{Epoch: "e", Position: 1}))
		ran := false
		tx.OnCommit(func() { ran = true })
		err := tx.Commit()
		if !errors.Is(err, errHook) {
			t.Fatalf("Commit = %v, want the hook's error", err)
		}
		equal(t, "error", err.Error(), "commit: injected")
		equal(t, "hook calls", hooked, 1)
		if ran {
			t.Fatal("OnCommit ran though the hook failed")
		}
		equal(t, "rows", len(allRows(t, s)), 0)
		cps, err := s.Positions(ctx, "f")
		must(t, err)
		equal(t, "positions", len(cps), 0)
		select {
		case <-s.Committed():
			t.Fatal("Committed signalled for a failed commit")
		default:
		}

		// The writer is free again, and without the hook a commit stands.
		s.SetCommitHook(nil)
		emit(t, s, place("f", 1), out("t", "", "w"))
		equal(t, "hook calls", hooked, 1)
		samePlaces(t, allRows(t, s), []rowPlace{{1, "f", 0, "e", 1, 0, "t", "", "w"}})
	})

	t.Run("HookSeesTransaction", func(t *testing.T) {
		s, _ := openStore(t)
		calls := 0
		s.SetCommitHook(func(context.Context) error { calls++; return nil })
		emit(t, s, place("f", 1), out("t", "", "v"))
		equal(t, "hook calls", calls, 1)
		equal(t, "rows", len(allRows(t, s)), 1)
	})

	t.Run("NotBoundToBeginContext", func(t *testing.T) {
		s, _ := openStore(t)
		bctx, cancel := context.WithCancel(ctx)
		tx, err := s.Begin(bctx)
		must(t, err)
		defer tx.Rollback()
		cancel()
		// A shutdown commits the batch in hand after its context is done.
		must(t, tx.BeginItem(place("f", 1)))
		must(t, tx.Emit(ctx, out("t", "", "v")))
		must(t, tx.EndItem())
		must(t, tx.Commit())
		equal(t, "rows", len(allRows(t, s)), 1)
	})
}

func TestStore_Committed(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	signalled := func() bool {
		select {
		case <-s.Committed():
			return true
		default:
			return false
		}
	}
	if signalled() {
		t.Fatal("signalled before any commit")
	}

	// A commit without rows: no signal.
	tx := begin(t, s)
	_, err := tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES ('k', 'v')`)
	must(t, err)
	must(t, tx.Commit())
	if signalled() {
		t.Fatal("signalled after a commit without rows")
	}

	// A commit whose rows were all rolled back: no signal.
	tx = begin(t, s)
	must(t, tx.BeginItem(place("f", 1)))
	must(t, tx.Emit(ctx, out("t", "", "v")))
	must(t, tx.RollbackItem())
	must(t, tx.Commit())
	if signalled() {
		t.Fatal("signalled after a commit whose rows were rolled back")
	}

	// A commit with rows: one signal, and two commits coalesce into one.
	emit(t, s, place("f", 1), out("t", "", "v"))
	if !signalled() {
		t.Fatal("not signalled after a commit with rows")
	}
	if signalled() {
		t.Fatal("signalled twice for one commit")
	}
	emit(t, s, place("f", 2), out("t", "", "v"))
	emit(t, s, place("f", 3), out("t", "", "v"))
	if !signalled() {
		t.Fatal("not signalled after two commits with rows")
	}
	if signalled() {
		t.Fatal("the signal's buffer holds more than one")
	}
}

func TestTx_Stmt(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)

	t.Run("OK", func(t *testing.T) {
		tx := begin(t, s)
		const q = `SELECT count(*) FROM meta WHERE key = ?`
		a, err := tx.Stmt(ctx, q)
		must(t, err)
		b, err := tx.Stmt(ctx, q)
		must(t, err)
		if a != b {
			t.Fatal("the same query was prepared twice in one transaction")
		}
		c, err := tx.Stmt(ctx, `SELECT count(*) FROM outbox_chunks`)
		must(t, err)
		if c == a {
			t.Fatal("two queries share a statement")
		}
		// The statement runs inside the transaction: it sees its writes.
		_, err = tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES ('mine', 'v')`)
		must(t, err)
		var n int
		must(t, a.GetContext(ctx, &n, "mine"))
		equal(t, "rows seen", n, 1)
		must(t, tx.Rollback())

		// A new transaction has its own.
		tx2 := begin(t, s)
		d, err := tx2.Stmt(ctx, q)
		must(t, err)
		if d == a {
			t.Fatal("a statement outlived its transaction")
		}
		must(t, d.GetContext(ctx, &n, "mine"))
		equal(t, "rows seen after rollback", n, 0)
		must(t, tx2.Commit())

		// Once a transaction that used it committed, the statement stays
		// prepared on the writer: the next transaction reuses it, and it
		// still sees that transaction's writes.
		tx3 := begin(t, s)
		e, err := tx3.Stmt(ctx, q)
		must(t, err)
		_, err = tx3.Exec(ctx, `INSERT INTO meta (key, value) VALUES ('mine', 'v')`)
		must(t, err)
		must(t, e.GetContext(ctx, &n, "mine"))
		equal(t, "rows seen through a kept statement", n, 1)
		must(t, tx3.Rollback())
		tx4 := begin(t, s)
		f, err := tx4.Stmt(ctx, q)
		must(t, err)
		must(t, f.GetContext(ctx, &n, "mine"))
		equal(t, "rows seen after the rollback", n, 0)
	})

	t.Run("ErrBadSQL", func(t *testing.T) {
		tx := begin(t, s)
		_, err := tx.Stmt(ctx, "SELEC nonsense\nFROM nowhere")
		if err == nil {
			t.Fatal("no error")
		}
		want := `prepare "SELEC nonsense ...": `
		if got := err.Error(); len(got) < len(want) || got[:len(want)] != want {
			t.Fatalf("error = %q, want prefix %q", got, want)
		}
	})
}

func TestChunkSize(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{1, 1}, {2, 2}, {3, 2}, {4, 4}, {63, 32}, {64, 64}, {65, 64}, {1000, 64},
	} {
		equal(t, fmt.Sprint("ChunkSize(", c.n, ", 64)"), outbox.ChunkSize(c.n, 64), c.want)
	}
}

// Emit honours its context: a done one fails the call and adds no row.
func TestTx_EmitHonoursContext(t *testing.T) {
	s, _ := openStore(t)
	tx := begin(t, s)
	defer tx.Rollback()
	must(t, tx.BeginItem(place("f", 1)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := tx.Emit(ctx, outbox.Output{Topic: "t", Value: []byte("v")})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Emit with a cancelled context = %v, want context.Canceled", err)
	}
	equal(t, "rows emitted", tx.Emitted(), 0)
	must(t, tx.Emit(context.Background(), outbox.Output{Topic: "t", Value: []byte("v")}))
	equal(t, "rows emitted", tx.Emitted(), 1)
}
