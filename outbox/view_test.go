package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestStore_View(t *testing.T) {
	ctx := context.Background()
	count := func(t *testing.T, r *outbox.ReadTx) int {
		t.Helper()
		var n int
		must(t, r.Get(ctx, &n, `SELECT count(*) FROM meta WHERE key LIKE 'view-%'`))
		return n
	}
	write := func(t *testing.T, s *outbox.Store, key string) {
		t.Helper()
		tx := begin(t, s)
		if _, err := tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES (?, 'v')`, key); err != nil {
			t.Fatal(err)
		}
		must(t, tx.Commit())
	}

	t.Run("OneCommit", func(t *testing.T) {
		s, _ := openStore(t)
		write(t, s, "view-1")
		must(t, s.View(ctx, func(r *outbox.ReadTx) error {
			equal(t, "rows before the write", count(t, r), 1)
			// A commit made while the view is open is not in it: the
			// view's reads see the commit its first read saw.
			write(t, s, "view-2")
			equal(t, "rows after the write, in the same view", count(t, r), 1)
			var keys []string
			must(t, r.Select(ctx, &keys, `SELECT key FROM meta WHERE key LIKE 'view-%' ORDER BY key`))
			equal(t, "keys", len(keys), 1)
			equal(t, "key", keys[0], "view-1")
			return nil
		}))
		must(t, s.View(ctx, func(r *outbox.ReadTx) error {
			equal(t, "rows in a new view", count(t, r), 2)
			return nil
		}))
	})

	t.Run("Query", func(t *testing.T) {
		s, _ := openStore(t)
		write(t, s, "view-a")
		write(t, s, "view-b")
		var got []string
		must(t, s.View(ctx, func(r *outbox.ReadTx) error {
			rows, err := r.Query(ctx, `SELECT key FROM meta WHERE key LIKE 'view-%' ORDER BY key`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					return err
				}
				got = append(got, k)
			}
			return rows.Err()
		}))
		equal(t, "keys", len(got), 2)
		equal(t, "first", got[0], "view-a")
		equal(t, "second", got[1], "view-b")
	})

	t.Run("ErrWrite", func(t *testing.T) {
		s, _ := openStore(t)
		err := s.View(ctx, func(r *outbox.ReadTx) error {
			_, err := r.Query(ctx, `INSERT INTO meta (key, value) VALUES ('view-x', 'v')`)
			return err
		})
		if err == nil {
			t.Fatal("a write through a view succeeded")
		}
		var n int
		must(t, outboxtest.Get(ctx, s, &n, `SELECT count(*) FROM meta WHERE key = 'view-x'`))
		equal(t, "rows written through the view", n, 0)
	})

	t.Run("ErrNoRows", func(t *testing.T) {
		s, _ := openStore(t)
		var v string
		err := s.View(ctx, func(r *outbox.ReadTx) error {
			return r.Get(ctx, &v, `SELECT value FROM meta WHERE key = 'absent'`)
		})
		if !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("View = %v, want sql.ErrNoRows", err)
		}
	})
}

// TestOutboxtest_ExecOnTheWriter: a per-connection setting made through
// outboxtest.Exec holds for the store's own writes.
func TestOutboxtest_ExecOnTheWriter(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	if outboxtest.OnPostgres() {
		// A session's setting on PostgreSQL: the store's writes run
		// under it.
		if _, err := outboxtest.Exec(ctx, s, `SET lock_timeout = '4321ms'`); err != nil {
			t.Fatal(err)
		}
		tx := begin(t, s)
		defer tx.Rollback()
		var got string
		must(t, tx.Get(ctx, &got, `SELECT current_setting('lock_timeout')`))
		equal(t, "lock_timeout in the store's transaction", got, "4321ms")
		return
	}
	var pages int
	must(t, outboxtest.Get(ctx, s, &pages, `PRAGMA page_count`))
	if _, err := outboxtest.Exec(ctx, s, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
		t.Fatal(err)
	}
	tx := begin(t, s)
	_, err := tx.Exec(ctx, `CREATE TABLE big AS SELECT zeroblob(1000000) AS b`)
	tx.Rollback()
	if code, ok := outbox.SQLiteCode(err); !ok || code&0xff != 13 { // SQLITE_FULL
		t.Fatalf("a write past max_page_count = %v, want SQLITE_FULL", err)
	}
}

// TestStore_NoHandle: no method of a Store or of its transactions hands out
// a database handle or connection; other packages reach the database
// through named methods only.
func TestStore_NoHandle(t *testing.T) {
	handles := []reflect.Type{
		reflect.TypeFor[*sql.DB](), reflect.TypeFor[*sql.Conn](), reflect.TypeFor[*sql.Tx](),
		reflect.TypeFor[*sqlx.DB](), reflect.TypeFor[*sqlx.Conn](), reflect.TypeFor[*sqlx.Tx](),
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[*outbox.Store](), reflect.TypeFor[*outbox.Tx](), reflect.TypeFor[*outbox.ReadTx]()} {
		for i := range typ.NumMethod() {
			m := typ.Method(i)
			for j := range m.Type.NumOut() {
				if out := m.Type.Out(j); slices.Contains(handles, out) {
					t.Errorf("%s.%s returns a %s", typ, m.Name, out)
				}
			}
		}
	}
}
