package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// endlessInsert is a write that never ends: only its context's deadline
// stops it, and SQLite then rolls the whole transaction back.
const endlessInsert = `INSERT INTO t SELECT count(*)
FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT i FROM c)`

// A Tx that SQLite rolled back refuses every later statement and its
// commit (each would otherwise commit by itself, outside any transaction),
// and says so with ErrTxLost; a failure that leaves the transaction
// standing is not a loss.
func TestTx_Lost(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(ctx, `CREATE TABLE t (n INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.BeginItem(place("f", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Emit(ctx, out("x", "k", "v")); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	endless := endlessInsert
	if outboxtest.OnPostgres() {
		endless = `INSERT INTO t SELECT count(*) FROM generate_series(1, 1000000000000)`
	}
	_, err = tx.Exec(actx, endless)
	if outboxtest.OnPostgres() {
		// PostgreSQL cancels the statement alone (a cancel request):
		// the transaction stands, the item's savepoint is rolled back.
		if errors.Is(err, outbox.ErrTxLost) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("interrupted write: %v, want the deadline and the transaction standing", err)
		}
		must(t, tx.RollbackItem())
		must(t, tx.Commit())
		if rows := allRows(t, s); len(rows) != 0 {
			t.Fatalf("outbox rows %+v, want none", rows)
		}
		return
	}
	if !errors.Is(err, outbox.ErrTxLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("interrupted write: %v, want ErrTxLost and the deadline", err)
	}
	if tx.Lost() == nil {
		t.Fatal("Lost() = nil after the loss")
	}
	if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`); !errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("a statement after the loss: %v, want ErrTxLost", err)
	}
	if _, err := tx.Stmt(ctx, `SELECT 1`); !errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("Stmt after the loss: %v, want ErrTxLost", err)
	}
	if err := tx.RollbackItem(); !errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("RollbackItem: %v, want ErrTxLost", err)
	}
	if err := tx.Commit(); !errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("Commit: %v, want ErrTxLost", err)
	}
	var n int
	tables := `SELECT count(*) FROM sqlite_schema WHERE name = 't'`
	if outboxtest.OnPostgres() {
		tables = `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = 't'`
	}
	if err := outbox.ReadPoolOf(s).Get(&n, tables); err != nil || n != 0 {
		t.Fatalf("the lost transaction's table: %d, %v; want none", n, err)
	}
	if rows := allRows(t, s); len(rows) != 0 {
		t.Fatalf("outbox rows %+v, want none", rows)
	}

	tx, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tx.BeginItem(place("f", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`); err == nil || errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("a statement that does not compile: %v, want an error that is not ErrTxLost", err)
	}
	if err := tx.Emit(ctx, out("x", "k", "v")); err != nil {
		t.Fatal(err)
	}
	if outboxtest.OnPostgres() {
		// PostgreSQL refuses every statement after a failed one until
		// the item's savepoint is rolled back: an item ended instead
		// loses the transaction (the ingest loop then fails the item).
		if err := tx.EndItem(); !errors.Is(err, outbox.ErrTxLost) {
			t.Fatalf("EndItem after a failed statement = %v, want ErrTxLost", err)
		}
		return
	}
	if err := tx.EndItem(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if rows := allRows(t, s); len(rows) != 1 || string(rows[0].Value) != "v" {
		t.Fatalf("outbox rows %+v, want the one emitted", rows)
	}
}
