package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	sqlite3 "modernc.org/sqlite/lib"
)

func openInternal(t *testing.T, path string, busy time.Duration) *Store {
	t.Helper()
	cfg := DefaultConfig(path)
	cfg.BusyTimeout = busy
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// codeErr is an error that reports an SQLite result code, for the codes no
// test here can make SQLite return for real.
type codeErr int

func (c codeErr) Error() string { return fmt.Sprintf("sqlite code %d", int(c)) }
func (c codeErr) Code() int     { return int(c) }

// Each class from an error SQLite really returned, where one can be
// provoked; the few others from their result codes.
func TestClassify(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	real := map[string]func(t *testing.T) error{
		"Busy": func(t *testing.T) error {
			path := filepath.Join(dir, "busy.db")
			a := openInternal(t, path, 5*time.Second)
			b := openInternal(t, path, 10*time.Millisecond)
			tx, err := a.Begin(ctx) // BEGIN IMMEDIATE: holds the write lock
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			btx, err := b.Begin(ctx)
			if err == nil {
				btx.Rollback()
			}
			return err
		},
		"Full": func(t *testing.T) error {
			s := openInternal(t, filepath.Join(dir, "full.db"), time.Second)
			var pages int
			if err := s.db.GetContext(ctx, &pages, "PRAGMA page_count"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.db.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
				t.Fatal(err)
			}
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			_, err = tx.Exec(ctx, `INSERT INTO meta VALUES ('big', ?)`, string(bytes.Repeat([]byte("x"), 1<<20)))
			return err
		},
		"IOImmutable": func(t *testing.T) error {
			if os.Geteuid() != 0 {
				t.Skip("chattr +i needs root: not root")
			}
			path := filepath.Join(dir, "immutable.db")
			s := openInternal(t, path, time.Second)
			if out, err := exec.Command("chattr", "+i", path, path+"-wal").CombinedOutput(); err != nil {
				t.Skipf("chattr +i not supported here: %v: %s", err, out)
			}
			defer exec.Command("chattr", "-i", path, path+"-wal").Run()
			tx, err := s.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO meta VALUES ('k', 'v')`); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit()
		},
		"ReadOnly": func(t *testing.T) error {
			s := openInternal(t, filepath.Join(dir, "ro.db"), time.Second)
			_, err := s.rdb.ExecContext(ctx, `INSERT INTO meta VALUES ('k', 'v')`) // query_only
			return err
		},
		"CantOpen": func(t *testing.T) error {
			db, err := sqlx.Open("sqlite", "file:"+filepath.Join(dir, "no", "such", "dir.db")+"?mode=ro")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			return db.PingContext(ctx)
		},
		"NotADatabase": func(t *testing.T) error {
			path := filepath.Join(dir, "junk.db")
			if err := os.WriteFile(path, bytes.Repeat([]byte("not a database "), 1000), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Open(ctx, DefaultConfig(path))
			return err
		},
		"Corrupt": func(t *testing.T) error {
			path := filepath.Join(dir, "corrupt.db")
			s := openInternal(t, path, time.Second)
			var size int
			if err := s.db.GetContext(ctx, &size, "PRAGMA page_size"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
				t.Fatal(err)
			}
			s.Close()
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			// Every page but the header's: the schema's b-trees are garbage.
			junk := bytes.Repeat([]byte{0xA5}, size)
			for off := int64(size); off < 8*int64(size); off += int64(size) {
				f.WriteAt(junk, off)
			}
			f.Close()
			s2, err := Open(ctx, DefaultConfig(path))
			if err != nil {
				return err
			}
			defer s2.Close()
			_, err = s2.Positions(ctx, "f")
			return err
		},
		"Constraint": func(t *testing.T) error {
			s := openInternal(t, filepath.Join(dir, "constraint.db"), time.Second)
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.Exec(ctx, `INSERT INTO meta VALUES ('k', 'v')`); err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO meta VALUES ('k', 'w')`)
			return err
		},
		"Fenced": func(t *testing.T) error {
			path := filepath.Join(dir, "fenced.db")
			a := openInternal(t, path, time.Second)
			b := openInternal(t, path, time.Second)
			if _, err := a.Claim(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Claim(ctx); err != nil {
				t.Fatal(err)
			}
			tx, err := a.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return tx.Commit()
		},
		"OtherSyntax": func(t *testing.T) error {
			s := openInternal(t, filepath.Join(dir, "syntax.db"), time.Second)
			_, err := s.rdb.ExecContext(ctx, `SELEKT 1`)
			return err
		},
		"OtherHook": func(t *testing.T) error {
			s := openInternal(t, filepath.Join(dir, "hook.db"), time.Second)
			s.SetCommitHook(func(context.Context) error { return errors.New("injected") })
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return tx.Commit()
		},
	}
	want := map[string]ErrorClass{
		"Busy": ClassBusy, "Full": ClassFull, "IOImmutable": ClassIO,
		"ReadOnly": ClassReadOnly, "CantOpen": ClassReadOnly, "NotADatabase": ClassCorrupt,
		"Corrupt": ClassCorrupt, "Constraint": ClassConstraint, "Fenced": ClassFenced,
		"OtherSyntax": ClassOther, "OtherHook": ClassOther,
	}
	for name, provoke := range real {
		t.Run(name, func(t *testing.T) {
			err := provoke(t)
			if err == nil {
				t.Fatal("no error: the case did not provoke one")
			}
			wrapped := fmt.Errorf("outer: %w", err)
			if got := Classify(wrapped); got != want[name] {
				code, _ := SQLiteCode(err)
				t.Fatalf("Classify(%v) (code %d) = %v, want %v", err, code, got, want[name])
			}
		})
	}

	for _, tc := range []struct {
		code int
		want ErrorClass
	}{
		{sqlite3.SQLITE_LOCKED, ClassBusy},
		{sqlite3.SQLITE_PROTOCOL, ClassBusy},
		{sqlite3.SQLITE_BUSY_SNAPSHOT, ClassBusy},
		{sqlite3.SQLITE_IOERR_FSYNC, ClassIO},
		{sqlite3.SQLITE_NOMEM, ClassIO},
		{sqlite3.SQLITE_PERM, ClassReadOnly},
		{sqlite3.SQLITE_READONLY_DBMOVED, ClassMoved},
		{sqlite3.SQLITE_CORRUPT_INDEX, ClassCorrupt},
		{sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY, ClassConstraint},
		{sqlite3.SQLITE_ERROR, ClassOther},
	} {
		if got := Classify(fmt.Errorf("x: %w", codeErr(tc.code))); got != tc.want {
			t.Errorf("Classify(code %d) = %v, want %v", tc.code, got, tc.want)
		}
	}
	if got := Classify(nil); got != ClassNone {
		t.Errorf("Classify(nil) = %v", got)
	}
}

func TestErrorClass_Predicates(t *testing.T) {
	for _, tc := range []struct {
		c                      ErrorClass
		fatal, lasting, stores bool
	}{
		{ClassNone, false, false, false},
		{ClassOther, false, false, false},
		{ClassBusy, false, false, true},
		{ClassFull, false, true, true},
		{ClassIO, false, true, true},
		{ClassReadOnly, false, true, true},
		{ClassMoved, true, false, true},
		{ClassCorrupt, true, false, true},
		{ClassConstraint, false, false, false},
		{ClassFenced, true, false, true},
	} {
		if tc.c.Fatal() != tc.fatal || tc.c.Lasting() != tc.lasting || tc.c.Store() != tc.stores {
			t.Errorf("%v: fatal %v lasting %v store %v, want %v %v %v", tc.c,
				tc.c.Fatal(), tc.c.Lasting(), tc.c.Store(), tc.fatal, tc.lasting, tc.stores)
		}
	}
}
