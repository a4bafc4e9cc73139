package sqlproc_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// strictConfig is a processor over a STRICT table, with migrations ms.
func strictConfig(ms ...sqlproc.Migration) sqlproc.Config {
	c := csvConfig()
	c.Setup = "CREATE TABLE IF NOT EXISTS t (account TEXT PRIMARY KEY, n INTEGER NOT NULL) STRICT"
	c.Apply = "INSERT INTO t (account, n) VALUES (:account, :amount) ON CONFLICT (account) DO UPDATE SET n = n + excluded.n"
	c.Migrations = ms
	return c
}

var (
	mig2 = sqlproc.Migration{Version: 2, SQL: "ALTER TABLE t ADD COLUMN note TEXT NOT NULL DEFAULT '';\n"}
	mig3 = sqlproc.Migration{Version: 3, SQL: "ALTER TABLE t ADD COLUMN seen INTEGER NOT NULL DEFAULT 0;\nCREATE INDEX t_seen ON t (seen);"}
)

// columns are table's columns, in order.
func columns(t *testing.T, s *outbox.Store, table string) []string {
	t.Helper()
	var cols []string
	if err := outboxtest.Select(context.Background(), s, &cols, "SELECT name FROM pragma_table_info(?) ORDER BY cid", table); err != nil {
		t.Fatal(err)
	}
	return cols
}

// ranMigrations are the versions processor_migrations holds for p.
func ranMigrations(t *testing.T, s *outbox.Store) []int64 {
	t.Helper()
	var vs []int64
	if err := outboxtest.Select(context.Background(), s, &vs, "SELECT version FROM processor_migrations WHERE processor = 'p' ORDER BY version"); err != nil {
		t.Fatal(err)
	}
	return vs
}

func setupErr(t *testing.T, s *outbox.Store, c sqlproc.Config) error {
	t.Helper()
	p, err := sqlproc.New(c)
	if err != nil {
		return err
	}
	return inTx(t, s, func(tx *outbox.Tx) error { return p.Setup(context.Background(), tx) })
}

func TestMigrations(t *testing.T) {
	s := openStore(t, nil)
	start := func(c sqlproc.Config, wantCols []string, wantRan []int64) {
		t.Helper()
		if err := setupErr(t, newStoreSame(t, s), c); err != nil {
			t.Fatal(err)
		}
		if got := columns(t, s, "t"); !reflect.DeepEqual(got, wantCols) {
			t.Fatalf("columns = %v, want %v", got, wantCols)
		}
		if got := ranMigrations(t, s); !reflect.DeepEqual(got, wantRan) {
			t.Fatalf("migrations ran = %v, want %v", got, wantRan)
		}
	}
	start(strictConfig(), []string{"account", "n"}, nil)
	if err := applyItem(t, s, newProc(t, strictConfig()), at(4), line("a,1")); err != nil {
		t.Fatal(err)
	}
	start(strictConfig(mig2), []string{"account", "n", "note"}, []int64{2})
	start(strictConfig(mig2), []string{"account", "n", "note"}, []int64{2}) // a restart: nothing runs again
	start(strictConfig(mig2, mig3), []string{"account", "n", "note", "seen"}, []int64{2, 3})
	start(strictConfig(mig2, mig3), []string{"account", "n", "note", "seen"}, []int64{2, 3})
	if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 1}) {
		t.Fatalf("state after the migrations = %v", got)
	}

	refused := func(c sqlproc.Config, want string) {
		t.Helper()
		err := setupErr(t, newStoreSame(t, s), c)
		if err == nil || err.Error() != want {
			t.Fatalf("start = %v\nwant    %s", err, want)
		}
		if got := columns(t, s, "t"); !reflect.DeepEqual(got, []string{"account", "n", "note", "seen"}) {
			t.Fatalf("columns after a refused start = %v", got)
		}
		if got := ranMigrations(t, s); !reflect.DeepEqual(got, []int64{2, 3}) {
			t.Fatalf("migrations after a refused start = %v", got)
		}
	}
	changed := mig2
	changed.SQL = "ALTER TABLE t ADD COLUMN note TEXT NOT NULL DEFAULT 'x';"
	refused(strictConfig(changed, mig3),
		"sqlproc p: migration 2: its SQL changed after it ran (sha256 607d6fafd6c4 ran, e799f944c8b4 now): a migration runs once; put the change in a new version")
	refused(strictConfig(mig2),
		"sqlproc p: the database has migrations the configuration lacks (3): the configuration is older than the database; start with one that has them")
	refused(strictConfig(),
		"sqlproc p: the database has migrations the configuration lacks (2, 3): the configuration is older than the database; start with one that has them")
	between := sqlproc.Migration{Version: 1, SQL: "CREATE INDEX t_n ON t (n)"}
	refused(strictConfig(between, mig2, mig3),
		"sqlproc p: migration 1 is new but migration 3 ran already: migrations run in order; give it a version above 3")
	bad := sqlproc.Migration{Version: 4, SQL: "ALTER TABLE t ADD COLUMN note TEXT"}
	refused(strictConfig(mig2, mig3, bad), "sqlproc p: migration 4 (ALTER TABLE t ADD COLUMN note TEXT): duplicate column name: note")
}

func TestMigrations_Check(t *testing.T) {
	for _, c := range []struct {
		name string
		ms   []sqlproc.Migration
		want string
	}{
		{"Order", []sqlproc.Migration{mig3, mig2}, "sqlproc p: migrations[1]: version 2 follows 3: list the versions in ascending order, each once"},
		{"Twice", []sqlproc.Migration{mig2, mig2}, "sqlproc p: migrations[1]: version 2 follows 2: list the versions in ascending order, each once"},
		{"Zero", []sqlproc.Migration{{Version: 0, SQL: "SELECT 1"}}, "sqlproc p: migrations[0]: version 0: want a positive integer"},
		{"Empty", []sqlproc.Migration{{Version: 2, SQL: " -- nothing\n"}}, "sqlproc p: migration 2: no statement"},
		{"Param", []sqlproc.Migration{{Version: 2, SQL: "UPDATE t SET n = :amount"}},
			"sqlproc p: migration 2 (UPDATE t SET n = :amount): parameter :amount: setup statements take no parameters"},
		{"Outboxd", []sqlproc.Migration{{Version: 2, SQL: "ALTER TABLE dead_letters ADD COLUMN x TEXT"}},
			"sqlproc p: migration 2 (ALTER TABLE dead_letters ADD COLUMN x TEXT): alters outboxd's table dead_letters"},
		{"Pragma", []sqlproc.Migration{{Version: 2, SQL: "PRAGMA journal_mode = delete"}},
			"sqlproc p: migration 2 (PRAGMA journal_mode = delete): PRAGMA journal_mode: user SQL may only run the pragmas that describe the schema"},
		{"NoSuchTable", []sqlproc.Migration{{Version: 2, SQL: "ALTER TABLE u ADD COLUMN x TEXT"}},
			"sqlproc p: migration 2 (ALTER TABLE u ADD COLUMN x TEXT): no such table: u"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := sqlproc.New(strictConfig(c.ms...))
			if err == nil || err.Error() != c.want {
				t.Fatalf("New = %v\nwant  %s", err, c.want)
			}
		})
	}
	// ADD COLUMN on a STRICT table, with constraints SQLite checks by
	// reading the table (NOT NULL, CHECK), compiles and runs.
	ok := sqlproc.Migration{Version: 2, SQL: "ALTER TABLE t ADD COLUMN c INTEGER NOT NULL DEFAULT 0 CHECK (c >= 0)"}
	if _, err := sqlproc.New(strictConfig(ok)); err != nil {
		t.Fatal(err)
	}
}
