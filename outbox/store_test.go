package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// clock is an injectable Config.Now that moves only when told to.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_700_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// openAt opens cfg and closes the store when the test ends.
func openAt(t *testing.T, cfg outbox.Config) *outbox.Store { return outboxtest.OpenStore(t, cfg) }

// storePath is where a test that opens its store more than once keeps
// it: a file in the test's temporary directory, or a PostgreSQL database
// of its own under OUTBOXD_TEST_STORE=postgres.
func storePath(t *testing.T, name string) string {
	t.Helper()
	if outboxtest.OnPostgres() {
		return pgtest.New(t).DSN
	}
	return filepath.Join(t.TempDir(), name)
}

// openStore opens a fresh store in t.TempDir() whose clock is the one returned.
func openStore(t *testing.T) (*outbox.Store, *clock) {
	t.Helper()
	c := newClock()
	return outboxtest.NewStore(t, func(cfg *outbox.Config) { cfg.Now = c.Now }), c
}

// pragma reads a PRAGMA through db as text.
func pragma(t *testing.T, db *sqlx.DB, name string) string {
	t.Helper()
	var v string
	if err := db.Get(&v, "PRAGMA "+name); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return v
}

func equal[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	testutil.Equal(t, what, got, want)
}

func TestStore_Open(t *testing.T) {
	outboxtest.SQLiteOnly(t, "opening a file: its directories, its PRAGMAs, older SQLite schemas")
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "a", "b", "t.db")
		s := openAt(t, outbox.DefaultConfig(path))
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("database file: %v", err)
		}
		equal(t, "Path()", s.Path(), path)
		equal(t, "Synchronous()", s.Synchronous(), outbox.SyncFull)
		// PRAGMAs other than journal_mode are per connection: ask the writer.
		equal(t, "journal_mode", pragma(t, outbox.WriterOf(s), "journal_mode"), "wal")
		equal(t, "synchronous", pragma(t, outbox.WriterOf(s), "synchronous"), "2")
		equal(t, "foreign_keys", pragma(t, outbox.WriterOf(s), "foreign_keys"), "1")
		equal(t, "busy_timeout", pragma(t, outbox.WriterOf(s), "busy_timeout"), "5000")
		equal(t, "user_version", pragma(t, outbox.WriterOf(s), "user_version"), fmt.Sprint(len(outboxd.Migrations())))
		// The readers are configured alike, and read-only.
		equal(t, "readers' journal_mode", pragma(t, outbox.ReadPoolOf(s), "journal_mode"), "wal")
		equal(t, "readers' synchronous", pragma(t, outbox.ReadPoolOf(s), "synchronous"), "2")
		equal(t, "readers' query_only", pragma(t, outbox.ReadPoolOf(s), "query_only"), "1")
		equal(t, "writer's query_only", pragma(t, outbox.WriterOf(s), "query_only"), "0")
		equal(t, "writer's open connections", outbox.WriterOf(s).Stats().MaxOpenConnections, 1)
		equal(t, "page_size", pragma(t, outbox.WriterOf(s), "page_size"), fmt.Sprint(outbox.PageSize))
		equal(t, "wal_autocheckpoint", pragma(t, outbox.WriterOf(s), "wal_autocheckpoint"), fmt.Sprint((4<<20)/outbox.PageSize))
	})

	// A database made before keeps its page size (in WAL mode SQLite can
	// no longer change it), and opens with its rows.
	t.Run("ExistingPageSizeKept", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "t.db")
		db, err := sqlx.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`PRAGMA page_size = 4096; PRAGMA journal_mode = wal; CREATE TABLE kept (x INTEGER); INSERT INTO kept VALUES (42)`); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		s := openAt(t, outbox.DefaultConfig(path))
		equal(t, "page_size", pragma(t, outbox.WriterOf(s), "page_size"), "4096")
		equal(t, "wal_autocheckpoint", pragma(t, outbox.WriterOf(s), "wal_autocheckpoint"), "1024") // 4 MiB of its pages
		var x int
		if err := outbox.WriterOf(s).Get(&x, `SELECT x FROM kept`); err != nil || x != 42 {
			t.Fatalf("kept row: %d, %v", x, err)
		}
		emit(t, s, place("f", 1), out("t", "k", "v"))
	})

	t.Run("SyncNormal", func(t *testing.T) {
		cfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "t.db"))
		cfg.Synchronous = outbox.SyncNormal
		s := openAt(t, cfg)
		equal(t, "Synchronous()", s.Synchronous(), outbox.SyncNormal)
		equal(t, "synchronous", pragma(t, outbox.WriterOf(s), "synchronous"), "1")
		equal(t, "readers' synchronous", pragma(t, outbox.ReadPoolOf(s), "synchronous"), "1")
	})

	t.Run("ZeroConfigDefaults", func(t *testing.T) {
		s := openAt(t, outbox.Config{Path: filepath.Join(t.TempDir(), "t.db")})
		equal(t, "Synchronous()", s.Synchronous(), outbox.SyncFull)
		equal(t, "synchronous", pragma(t, outbox.WriterOf(s), "synchronous"), "2")
		if s.Now().IsZero() {
			t.Fatal("Now() is zero: no default clock")
		}
	})

	t.Run("Reopen", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "t.db")
		s, err := outbox.Open(ctx, outbox.DefaultConfig(path))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f", Kind: "file"}); err != nil {
			t.Fatal(err)
		}
		emit(t, s, place("f", 7), out("t", "k", "v"))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}

		// Migrations re-run would fail on CREATE TABLE of an existing table.
		s = openAt(t, outbox.DefaultConfig(path))
		equal(t, "user_version", pragma(t, outbox.WriterOf(s), "user_version"), fmt.Sprint(len(outboxd.Migrations())))
		f, err := s.Feed(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "feed kind", f.Kind, "file")
		rows, err := s.Rows(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || rows[0].ID != 1 || string(rows[0].Value) != "v" {
			t.Fatalf("rows after reopen = %+v", rows)
		}
	})

	// A database of schema version 1 (with outbox_feed, an index by feed)
	// is migrated on open: the index goes, the rows stay.
	t.Run("FromVersion1", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "t.db")
		db, err := sqlx.Open("sqlite", "file:"+path+"?_pragma=journal_mode(wal)")
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{outboxd.Migrations()[0].SQL, "PRAGMA user_version = 1",
			`INSERT INTO outbox (feed, partition, epoch, position, n, topic, value, created_at) VALUES ('f', 0, 'e', 1, 0, 't', x'76', 5)`} {
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM sqlite_master WHERE name = 'outbox_feed'`); err != nil || n != 1 {
			t.Fatalf("version 1 has outbox_feed: %d, %v", n, err)
		}
		db.Close()

		s := openAt(t, outbox.DefaultConfig(path))
		equal(t, "user_version", pragma(t, outbox.WriterOf(s), "user_version"), fmt.Sprint(len(outboxd.Migrations())))
		if err := outbox.WriterOf(s).Get(&n, `SELECT count(*) FROM sqlite_master WHERE name = 'outbox_feed'`); err != nil || n != 0 {
			t.Fatalf("outbox_feed after migrating: %d, %v", n, err)
		}
		b, err := s.Backlog(ctx, "f", 0)
		must(t, err)
		equal(t, "backlog of f", b, outbox.Backlog{Pending: 1, OldestAt: 5})
	})

	// A database of schema version 4 (a row per output) is migrated on
	// open: each row becomes a chunk of its own, with its id, its place,
	// its bytes (an empty key or value stays empty, a NULL one NULL), and
	// the largest id ever assigned (here a pruned row's) stays the last.
	t.Run("FromVersion4", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "t.db")
		db, err := sqlx.Open("sqlite", "file:"+path+"?_pragma=journal_mode(wal)")
		if err != nil {
			t.Fatal(err)
		}
		qs := []string{}
		for _, m := range outboxd.Migrations()[:4] {
			qs = append(qs, m.SQL)
		}
		qs = append(qs, "PRAGMA user_version = 4",
			`INSERT INTO outbox (id, feed, partition, epoch, position, n, topic, key, value, headers, created_at) VALUES
(1, 'f', 0, 'e', 10, 0, 't', NULL, x'76', NULL, 5),
(2, 'f', 0, 'e', 20, 1, 'u', x'', x'', x'0102', 6),
(3, 'g', 2, 'e2', 30, 0, 't', x'6b', NULL, NULL, 7),
(4, 'g', 2, 'e2', 40, 0, 't', x'6b', x'77', NULL, 8)`,
			`DELETE FROM outbox WHERE id = 4`)
		for _, q := range qs {
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		db.Close()

		s := openAt(t, outbox.DefaultConfig(path))
		equal(t, "user_version", pragma(t, outbox.WriterOf(s), "user_version"), fmt.Sprint(len(outboxd.Migrations())))
		rows, err := s.Rows(ctx, 0, 10)
		must(t, err)
		want := []outbox.Row{
			{ID: 1, Feed: "f", Epoch: "e", Position: 10, Topic: "t", Value: []byte("v"), CreatedAt: 5},
			{ID: 2, Feed: "f", Epoch: "e", Position: 20, N: 1, Topic: "u", Key: []byte{}, Value: []byte{}, Headers: []byte{1, 2}, CreatedAt: 6},
			{ID: 3, Feed: "g", Partition: 2, Epoch: "e2", Position: 30, Topic: "t", Key: []byte("k"), CreatedAt: 7},
		}
		if !reflect.DeepEqual(rows, want) {
			t.Fatalf("rows after migrating:\n got %+v\nwant %+v", rows, want)
		}
		last, err := s.LastOutboxID(ctx)
		must(t, err)
		equal(t, "last outbox id", last, int64(4))
		// The view shows the same rows, one each.
		var viewed []struct {
			ID    int64  `db:"id"`
			Value []byte `db:"value"`
			Typ   string `db:"typ"`
		}
		must(t, outbox.ReadPoolOf(s).Select(&viewed, `SELECT id, value, typeof(key) AS typ FROM outbox ORDER BY id`))
		if len(viewed) != 3 || viewed[0].Typ != "null" || viewed[1].Typ != "blob" || string(viewed[2].Value) != "" || viewed[2].ID != 3 {
			t.Fatalf("the outbox view: %+v", viewed)
		}
		// The next output follows the largest id ever assigned.
		emit(t, s, place("f", 50), out("t", "", "next"))
		rows, err = s.Rows(ctx, 3, 10)
		must(t, err)
		if len(rows) != 1 || rows[0].ID != 5 {
			t.Fatalf("the next output: %+v, want id 5", rows)
		}
	})

	t.Run("PathWithURICharacters", func(t *testing.T) {
		// The path is put in a "file:" URI: '?', '#' and '%' in it must not
		// be taken for the query, a fragment or an escape.
		for _, dir := range []string{"with space", "hash#x", "query?x", "percent%41x"} {
			t.Run(dir, func(t *testing.T) {
				root := t.TempDir()
				path := filepath.Join(root, dir, "t.db")
				s, err := outbox.Open(ctx, outbox.DefaultConfig(path))
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if _, err := os.Stat(path); err != nil {
					ents, _ := os.ReadDir(root)
					var names []string
					for _, e := range ents {
						names = append(names, e.Name())
					}
					t.Fatalf("database not at its path (%v); %s holds %q", err, root, names)
				}
				equal(t, "busy_timeout", pragma(t, outbox.WriterOf(s), "busy_timeout"), "5000")
			})
		}
	})

	t.Run("ErrNewerSchema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "t.db")
		s, err := outbox.Open(ctx, outbox.DefaultConfig(path))
		if err != nil {
			t.Fatal(err)
		}
		n := len(outboxd.Migrations())
		if _, err := outbox.WriterOf(s).Exec(fmt.Sprintf("PRAGMA user_version = %d", n+1)); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s, err = outbox.Open(ctx, outbox.DefaultConfig(path))
		if err == nil {
			s.Close()
			t.Fatal("opened a database newer than the binary")
		}
		want := fmt.Sprintf("database schema version %d is newer than this binary's %d", n+1, n)
		equal(t, "error", err.Error(), want)
	})

	t.Run("ErrInvalidConfig", func(t *testing.T) {
		cfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "t.db"))
		cfg.Synchronous = "off"
		s, err := outbox.Open(ctx, cfg)
		if err == nil {
			s.Close()
			t.Fatal("no error")
		}
		equal(t, "error", err.Error(), `synchronous: "off" is not one of full, normal`)
		if _, err := os.Stat(cfg.Path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("an invalid config created the database: %v", err)
		}
	})

	t.Run("ErrDirectoryIsAFile", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(file, "t.db")))
		if err == nil {
			s.Close()
			t.Fatal("no error")
		}
		if !strings.HasPrefix(err.Error(), "create database directory: ") {
			t.Fatalf("error = %q", err)
		}
	})
}

func TestConfig_Validate(t *testing.T) {
	ok := outbox.DefaultConfig("x.db")
	t.Run("OK", func(t *testing.T) {
		if err := ok.Validate(); err != nil {
			t.Fatal(err)
		}
		normal := ok
		normal.Synchronous = outbox.SyncNormal
		normal.BusyTimeout = 0
		if err := normal.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range []struct {
		name   string
		change func(*outbox.Config)
		err    string
	}{
		{"ErrNoPath", func(c *outbox.Config) { c.Path = "" }, "db: a path is required"},
		{"ErrSynchronous", func(c *outbox.Config) { c.Synchronous = "FULL" }, `synchronous: "FULL" is not one of full, normal`},
		{"ErrEmptySynchronous", func(c *outbox.Config) { c.Synchronous = "" }, `synchronous: "" is not one of full, normal`},
		{"ErrNegativeBusyTimeout", func(c *outbox.Config) { c.BusyTimeout = -time.Second }, "busy timeout: -1s is negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.change(&cfg)
			err := cfg.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			equal(t, "error", err.Error(), c.err)
		})
	}
}

func TestStore_MetaID(t *testing.T) {
	ctx := context.Background()
	path := storePath(t, "t.db")
	s, err := outbox.Open(ctx, outbox.DefaultConfig(path))
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.MetaID(ctx, "relay_id")
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 16 || strings.Trim(a, "0123456789abcdef") != "" {
		t.Fatalf("id %q is not 16 hex digits", a)
	}
	again, err := s.MetaID(ctx, "relay_id")
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "second call", again, a)
	other, err := s.MetaID(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	if other == a {
		t.Fatalf("two keys share the id %q", a)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, outbox.DefaultConfig(path))
	reopened, err := s.MetaID(ctx, "relay_id")
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "after reopen", reopened, a)
}

func TestStore_ReadDB(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)

	t.Run("ErrWrite", func(t *testing.T) {
		_, err := outbox.ReadPoolOf(s).ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('k', 'v')`)
		if err == nil {
			t.Fatal("wrote through the read-only pool")
		}
		if outbox.Classify(err) != outbox.ClassReadOnly {
			t.Fatalf("error = %q", err)
		}
		var n int
		if err := outbox.WriterOf(s).Get(&n, `SELECT count(*) FROM meta WHERE key = 'k'`); err != nil {
			t.Fatal(err)
		}
		equal(t, "rows written", n, 0)
	})

	t.Run("SeesCommits", func(t *testing.T) {
		if _, err := outbox.WriterOf(s).ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('seen', 'yes')`); err != nil {
			t.Fatal(err)
		}
		var v string
		if err := outbox.ReadPoolOf(s).Get(&v, `SELECT value FROM meta WHERE key = 'seen'`); err != nil {
			t.Fatal(err)
		}
		equal(t, "value", v, "yes")
	})

	t.Run("NotBlockedByWriter", func(t *testing.T) {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES ('pending', 'x')`); err != nil {
			t.Fatal(err)
		}
		// The writer holds its lock; a reader must answer at once (WAL),
		// without the uncommitted row.
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var n int
		if err := outbox.ReadPoolOf(s).GetContext(rctx, &n, `SELECT count(*) FROM meta WHERE key = 'pending'`); err != nil {
			t.Fatal(err)
		}
		equal(t, "uncommitted rows seen", n, 0)
	})
}

func TestStore_IntegrityCheck(t *testing.T) {
	s, _ := openStore(t)
	emit(t, s, place("f", 1), out("t", "k", "v"))
	got, err := s.IntegrityCheck(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "integrity_check", got, "ok")
}

func TestStore_Close(t *testing.T) {
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(storePath(t, "t.db")))
	if err != nil {
		t.Fatal(err)
	}
	// A prepared statement in the store's cache is closed with it.
	if err := s.SetRelayProgress(context.Background(), "r", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := outbox.WriterOf(s).Ping(); err == nil {
		t.Fatal("writer still usable after Close")
	}
	if err := outbox.ReadPoolOf(s).Ping(); err == nil {
		t.Fatal("readers still usable after Close")
	}
}
