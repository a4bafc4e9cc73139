package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// rawExec runs query with args in the store's batch b.
func rawExec(b *outbox.Batch, query string, args ...any) error {
	return rawExecCtx(context.Background(), b, query, args...)
}

// rawExecCtx is rawExec with its statement's context.
func rawExecCtx(ctx context.Context, b *outbox.Batch, query string, args ...any) error {
	return b.Exec(ctx, outbox.NewStatement(query), args...)
}

// rawCount runs a query returning one integer in the store's batch b.
func rawCount(b *outbox.Batch, query string, args ...any) (int64, error) {
	return rawCountCtx(context.Background(), b, query, args...)
}

// rawCountCtx is rawCount with its statement's context.
func rawCountCtx(ctx context.Context, b *outbox.Batch, query string, args ...any) (int64, error) {
	rows, err := b.Query(ctx, outbox.NewStatement(query), args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	if ok, err := rows.Next(); !ok {
		return 0, fmt.Errorf("no row (%v)", err)
	}
	n := rows.Values()[0].(int64)
	if ok, err := rows.Next(); ok || err != nil {
		return 0, fmt.Errorf("a second row (%v)", err)
	}
	return n, nil
}

func metaCount(t *testing.T, s *outbox.Store, key string) int64 {
	t.Helper()
	tx := begin(t, s)
	defer tx.Rollback()
	var n int64
	must(t, tx.Get(context.Background(), &n, `SELECT count(*) FROM meta WHERE key = ?`, key))
	return n
}

func TestTx_Batch(t *testing.T) {
	const insert = `INSERT INTO meta (key, value) VALUES (?1, ?2)`
	const count = `SELECT count(*) FROM meta WHERE key = ?1`

	t.Run("InTheItemsSavepoint", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		must(t, tx.Batch(func(b *outbox.Batch) error {
			if err := rawExec(b, insert, "undone", "v"); err != nil {
				return err
			}
			n, err := rawCount(b, count, "undone")
			equal(t, "rows seen inside the item", n, 1)
			return err
		}))
		must(t, tx.RollbackItem())
		must(t, tx.BeginItem(place("f", 2)))
		must(t, tx.Batch(func(b *outbox.Batch) error {
			n, err := rawCount(b, count, "undone")
			if err != nil {
				return err
			}
			equal(t, "rows of the rolled back item", n, 0)
			return rawExec(b, insert, "kept", "v")
		}))
		must(t, tx.EndItem())
		must(t, tx.Commit())
		equal(t, "rolled back item's rows", metaCount(t, s, "undone"), 0)
		equal(t, "kept item's rows", metaCount(t, s, "kept"), 1)
	})

	t.Run("StatementsKept", func(t *testing.T) {
		s, _ := openStore(t)
		var first, again any
		for i, dst := range []*any{&first, &again} {
			tx := begin(t, s)
			must(t, tx.Batch(func(b *outbox.Batch) error {
				_, err := rawCount(b, count, "none")
				*dst = outbox.KeptDriverStmt(s, count)
				return err
			}))
			if i == 0 {
				must(t, tx.Commit())
			} else {
				must(t, tx.Rollback())
			}
		}
		if first == nil || first != again {
			t.Fatal("a query was prepared again in the next transaction")
		}
		n, most := outbox.KeptDriverStmts(s)
		equal(t, "statements kept", n, 1)

		// Past the cache's room, a statement is prepared for the call
		// and closed after it: the cache does not grow.
		tx := begin(t, s)
		must(t, tx.Batch(func(b *outbox.Batch) error {
			for i := range most + 10 {
				if err := rawExec(b, insert, fmt.Sprintf("k%d", i), fmt.Sprintf("statement %d", i)); err != nil {
					return err
				}
				// A distinct text per key, so each is a statement of its own.
				if _, err := rawCount(b, count+fmt.Sprintf(" AND %d = %d", i, i), fmt.Sprintf("k%d", i)); err != nil {
					return err
				}
			}
			return nil
		}))
		must(t, tx.Commit())
		n, _ = outbox.KeptDriverStmts(s)
		equal(t, "statements kept past the room", n, most)
		equal(t, "rows written past the room", metaCount(t, s, fmt.Sprintf("k%d", most+9)), 1)
	})

	t.Run("StatementError", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		must(t, tx.Batch(func(b *outbox.Batch) error { return rawExec(b, insert, "dup", "v") }))
		must(t, tx.EndItem())
		must(t, tx.BeginItem(place("f", 2)))
		err := tx.Batch(func(b *outbox.Batch) error { return rawExec(b, insert, "dup", "again") })
		if outbox.Classify(err) != outbox.ClassConstraint {
			t.Fatalf("Batch with a duplicate key = %v (%v), want a constraint error", err, outbox.Classify(err))
		}
		if tx.Lost() != nil {
			t.Fatalf("a constraint error lost the transaction: %v", tx.Lost())
		}
		must(t, tx.RollbackItem())
		must(t, tx.Commit())
		equal(t, "rows of the key", metaCount(t, s, "dup"), 1)
	})

	t.Run("PrepareError", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		defer tx.Rollback()
		err := tx.Batch(func(b *outbox.Batch) error {
			return rawExec(b, "SELEC nonsense\nFROM nowhere")
		})
		want := `prepare "SELEC nonsense ...": `
		if outboxtest.OnPostgres() {
			// Outside an item's savepoint a failed statement aborts
			// PostgreSQL's whole transaction.
			if !errors.Is(err, outbox.ErrTxLost) || !strings.Contains(err.Error(), want) {
				t.Fatalf("error = %v, want ErrTxLost and %q", err, want)
			}
			return
		}
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("error = %v, want prefix %q", err, want)
		}
	})

	// A processor writes the state it kept in memory from a BeforeCommit
	// function: Batch serves it there, in the transaction that commits.
	t.Run("InBeforeCommit", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		tx.BeforeCommit(func(context.Context) error {
			return tx.Batch(func(b *outbox.Batch) error { return rawExec(b, insert, "before-commit", "v") })
		})
		must(t, tx.Commit())
		equal(t, "rows written before the commit", metaCount(t, s, "before-commit"), 1)
		if err := tx.Batch(func(*outbox.Batch) error { return nil }); err == nil {
			t.Fatal("Batch after the commit: no error")
		}
	})

	t.Run("Ended", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.Commit())
		ran := false
		if err := tx.Batch(func(*outbox.Batch) error { ran = true; return nil }); err == nil || ran {
			t.Fatalf("Batch after Commit = %v, ran %v; want an error and no call", err, ran)
		}
	})

	// A panic of f reaches Batch's caller, and the transaction and its
	// connection stand (database/sql would close a connection whose Raw
	// function panicked).
	t.Run("Panic", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.BeginItem(place("f", 1)))
		got := func() (p any) {
			defer func() { p = recover() }()
			_ = tx.Batch(func(b *outbox.Batch) error {
				if err := rawExec(b, insert, "panicked", "v"); err != nil {
					return err
				}
				panic("processor bug")
			})
			return nil
		}()
		equal(t, "panic value", got, any("processor bug"))
		must(t, tx.RollbackItem())
		must(t, tx.BeginItem(place("f", 2)))
		must(t, tx.Batch(func(b *outbox.Batch) error { return rawExec(b, insert, "after", "v") }))
		must(t, tx.EndItem())
		must(t, tx.Commit())
		equal(t, "rows of the item that panicked", metaCount(t, s, "panicked"), 0)
		equal(t, "rows of the next item", metaCount(t, s, "after"), 1)
		n, _ := outbox.KeptDriverStmts(s)
		equal(t, "statements kept (the connection is the same)", n, 1)
	})

	// SQLite keeps a connection closed with statements still prepared
	// alive, its files open: Close must close them first.
	// The outbox inserts are the store's own statements on the driver's
	// connection: Close closes them too.
	t.Run("CloseReleasesTheFilesAfterOutputs", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "out.db")
		s, err := outbox.Open(context.Background(), outbox.DefaultConfig(path))
		must(t, err)
		tx := begin(t, s)
		for i := range 3 {
			must(t, tx.BeginItem(place("f", int64(i+1))))
			must(t, tx.Emit(context.Background(), outbox.Output{Topic: "t", Value: []byte("v")}))
			must(t, tx.EndItem())
		}
		must(t, tx.Commit())
		must(t, s.Close())
		if n := openFiles(t, path); n != 0 {
			t.Fatalf("%d descriptors of the database's files still open after Close", n)
		}
	})

	t.Run("CloseReleasesTheFiles", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "raw.db")
		s, err := outbox.Open(context.Background(), outbox.DefaultConfig(path))
		must(t, err)
		tx := begin(t, s)
		must(t, tx.Batch(func(b *outbox.Batch) error { return rawExec(b, insert, "k", "v") }))
		must(t, tx.Commit())
		if n := openFiles(t, path); n == 0 {
			t.Fatal("no file of the open store found in /proc/self/fd")
		}
		must(t, s.Close())
		if n := openFiles(t, path); n != 0 {
			t.Fatalf("%d descriptors of the database's files still open after Close", n)
		}
	})
}

// openFiles counts the process's descriptors open on path or its -wal and
// -shm files.
func openFiles(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && (target == path || target == path+"-wal" || target == path+"-shm") {
			n++
		}
	}
	return n
}
