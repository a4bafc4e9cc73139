package sqlproc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestClassify classifies errors real SQLite statements return.
func TestClassify(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	open := func() *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20)&_pragma=foreign_keys(on)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { db.Close() })
		return db
	}
	db := open()
	if _, err := db.Exec(`CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER NOT NULL CHECK (n > 0)) STRICT;
		INSERT INTO t VALUES ('a', 1); CREATE TABLE b (x BLOB)`); err != nil {
		t.Fatal(err)
	}
	run := func(db *sql.DB, q string) error {
		if _, err := db.Exec(q); err != nil {
			return err
		}
		return nil // the subtest fails: no error to classify

	}

	busy := func() error {
		holder, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback()
		if _, err := holder.Exec("INSERT INTO t VALUES ('b', 1)"); err != nil {
			t.Fatal(err)
		}
		return run(open(), "INSERT INTO t VALUES ('c', 1)")
	}
	full := func() error {
		other := open()
		var pages int
		if err := other.QueryRow("PRAGMA page_count").Scan(&pages); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Exec(fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
			t.Fatal(err)
		}
		return run(other, "INSERT INTO b VALUES (zeroblob(100000))")
	}
	deadline := func() error {
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := db.ExecContext(cctx, "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT count(*) FROM c")
		return err
	}
	denied := func() error {
		s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(t.TempDir(), "s.db")))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := Guard(ctx, s); err != nil {
			t.Fatal(err)
		}
		_, err = outboxtest.Exec(ctx, s, "CREATE TEMP TABLE outbox (x)")
		return err
	}

	for _, c := range []struct {
		name   string
		err    func() error
		reason string // "" for transient
	}{
		{"Unique", func() error { return run(db, "INSERT INTO t VALUES ('a', 1)") }, ReasonConstraint},
		{"NotNull", func() error { return run(db, "INSERT INTO t VALUES ('x', NULL)") }, ReasonConstraint},
		{"Check", func() error { return run(db, "INSERT INTO t VALUES ('x', 0)") }, ReasonConstraint},
		{"StrictType", func() error { return run(db, "INSERT INTO t VALUES ('x', 'one')") }, ReasonConstraint},
		{"BadJSON", func() error { return run(db, "SELECT json('{')") }, ReasonSQLError},
		{"Overflow", func() error { return run(db, "SELECT abs(-9223372036854775808)") }, ReasonSQLError},
		{"TooBig", func() error { return run(db, "SELECT zeroblob(2000000000)") }, ReasonSQLError},
		{"Denied", denied, ReasonForbidden},
		{"Busy", busy, ""},
		{"Full", full, ""},
		{"Deadline", deadline, ""},
		{"NotSQLite", func() error { return errors.New("driver: bad connection") }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.err()
			if err == nil {
				t.Fatal("no error")
			}
			got := classify(fmt.Errorf("wrapped: %w", err))
			p, perm := ingest.IsPermanent(got)
			switch {
			case c.reason == "" && perm:
				t.Fatalf("classify(%v) = permanent %q, want transient", err, p.Reason)
			case c.reason == "" && !errors.Is(got, err):
				t.Fatalf("classify(%v) = %v, want the error as it is", err, got)
			case c.reason != "" && (!perm || p.Reason != c.reason):
				t.Fatalf("classify(%v) = %v, want permanent %q", err, got, c.reason)
			}
		})
	}
}
