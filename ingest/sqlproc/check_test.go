package sqlproc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest/sqlproc"
)

func TestCheck(t *testing.T) {
	ctx := context.Background()
	if err := sqlproc.Check(ctx, csvConfig()); err != nil {
		t.Fatalf("valid configuration: %v", err)
	}
	for _, c := range []struct {
		name   string
		change func(c *sqlproc.Config)
		err    string
	}{
		{"ErrValidate", func(c *sqlproc.Config) { c.Input = "" }, "sqlproc p: input: missing, want one of csv, json, raw"},
		{"ErrSyntax", func(c *sqlproc.Config) { c.Apply = "INSERT INTO t VALUS (:account, 1)" },
			`sqlproc p: apply (INSERT INTO t VALUS (:account, 1)): near "VALUS": syntax error`},
		{"ErrUnknownTable", func(c *sqlproc.Config) { c.Apply = "INSERT INTO nope VALUES (:account, 1)" },
			"sqlproc p: apply (INSERT INTO nope VALUES (:account, 1)): no such table: nope"},
		{"ErrUnknownColumn", func(c *sqlproc.Config) { c.Apply = "UPDATE t SET m = 1 WHERE account = :account" },
			"sqlproc p: apply (UPDATE t SET m = 1 WHERE account = :account): no such column: m"},
		{"ErrSecondApplyStatement", func(c *sqlproc.Config) {
			c.Apply += "; DELETE FROM t WHERE n = 0; UPDATE t SET n = :amount WHERE acount = 1"
		}, "sqlproc p: apply statement 3 (UPDATE t SET n = :amount WHERE acount = 1): no such column: acount"},
		{"ErrUnknownFunction", func(c *sqlproc.Config) { c.Reject = "SELECT 'bad' WHERE nofunc(:amount)" },
			"sqlproc p: reject (SELECT 'bad' WHERE nofunc(:amount)): no such function: nofunc"},
		{"ErrEmitNoValue", func(c *sqlproc.Config) { c.Emit = "SELECT :account AS key FROM t" },
			`sqlproc p: emit (SELECT :account AS key FROM t): no column "value" (columns: key)`},
		{"ErrEmitNoKey", func(c *sqlproc.Config) { c.Emit = "SELECT 'v' AS value" },
			`sqlproc p: emit (SELECT 'v' AS value): no column "key" (columns: value)`},
		{"ErrEmitNoTopic", func(c *sqlproc.Config) { c.Topic = "" },
			`sqlproc p: emit (SELECT :account AS key, CAST(n AS TEXT) AS value ...): no column "topic", and the processor has no default topic`},
		{"ErrEmitUnnamedColumn", func(c *sqlproc.Config) { c.Emit = "SELECT :account AS key, n, n AS value FROM t" },
			`sqlproc p: emit (SELECT :account AS key, n, n AS value FROM t): column "n" is not one of topic, key, value, headers (name columns with AS)`},
		{"ErrEmitTwice", func(c *sqlproc.Config) { c.Emit = "SELECT 'k' AS key, 'a' AS value, 'b' AS value" },
			`sqlproc p: emit (SELECT 'k' AS key, 'a' AS value, 'b' AS value): column "value" comes twice`},
		{"ErrEmitNoRows", func(c *sqlproc.Config) { c.Emit = "DELETE FROM t WHERE account = :account" },
			`sqlproc p: emit (DELETE FROM t WHERE account = :account): no column "key" (columns: )`},
		{"ErrRejectColumns", func(c *sqlproc.Config) { c.Reject = "SELECT 1, 2, 3" },
			"sqlproc p: reject (SELECT 1, 2, 3): returns 3 columns, want the reason and, optionally, the error"},
		{"ErrRejectNoRows", func(c *sqlproc.Config) { c.Reject = "DELETE FROM t" },
			"sqlproc p: reject (DELETE FROM t): returns 0 columns, want the reason and, optionally, the error"},
		{"ErrApplyRows", func(c *sqlproc.Config) { c.Apply = "SELECT n FROM t" },
			"sqlproc p: apply (SELECT n FROM t): returns rows (columns n), which apply would throw away: outputs come from emit"},
		{"ErrSetupFails", func(c *sqlproc.Config) { c.Setup += "; CREATE TABLE t (y)" },
			"sqlproc p: setup statement 2 (CREATE TABLE t (y)): table t already exists"},
		{"ErrSetupSyntax", func(c *sqlproc.Config) { c.Setup = "CREATE TABLE t (account TEXT PRIMARY KEY, n INTEGER NOT NULL" },
			"sqlproc p: setup (CREATE TABLE t (account TEXT PRIMARY KEY, n INTE ...): incomplete input"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := csvConfig()
			c.change(&cfg)
			err := sqlproc.Check(ctx, cfg)
			if err == nil || err.Error() != c.err {
				t.Fatalf("Check() = %v\nwant %s", err, c.err)
			}
			if _, nerr := sqlproc.New(cfg); nerr == nil || nerr.Error() != c.err {
				t.Fatalf("New() = %v, want Check's error", nerr)
			}
		})
	}
}

// schemaTables are outboxd's tables: user SQL may read them, never write them.
var schemaTables = []string{"meta", "feeds", "positions", "outbox_chunks", "outbox_ids", "outbox_slots", "dead_letters",
	"losses", "relay_progress", "ledger_balances"}

// aColumn names a column of each table (some have no rowid).
var aColumn = map[string]string{"meta": "key", "feeds": "name", "positions": "feed", "outbox": "id",
	"outbox_chunks": "last_id", "outbox_ids": "last_id", "outbox_slots": "i", "dead_letters": "id",
	"losses": "id", "relay_progress": "relay_id", "ledger_balances": "feed", "sqlite_sequence": "name"}

// TestCheck_ForbiddenTables tries every way user SQL has to write
// outboxd's tables, from every statement field: each is refused at load,
// naming the table.
func TestCheck_ForbiddenTables(t *testing.T) {
	ctx := context.Background()
	for _, table := range append(schemaTables, "sqlite_sequence", "sqlite_stat1") {
		writes := map[string]string{
			"Insert": fmt.Sprintf("INSERT INTO %s DEFAULT VALUES", table),
			"Update": fmt.Sprintf("UPDATE %s SET %s = %[2]s WHERE :account IS NULL", table, aColumn[table]),
			"Delete": fmt.Sprintf("DELETE FROM %s WHERE :amount IS NULL", table),
			"Upper":  fmt.Sprintf("DELETE FROM main.%s", strings.ToUpper(table)),
		}
		if table == "sqlite_stat1" {
			writes = map[string]string{"Insert": "INSERT INTO sqlite_stat1 VALUES ('t', NULL, '1')"}
		}
		want := fmt.Sprintf("writes outboxd's table %s (user SQL may read outboxd's tables, never write them)", table)
		for op, stmt := range writes {
			for _, field := range []string{"setup", "apply", "reject", "emit"} {
				t.Run(table+"/"+op+"/"+field, func(t *testing.T) {
					cfg := csvConfig()
					switch field {
					case "setup":
						if strings.Contains(stmt, ":") {
							return // setup takes no parameters
						}
						cfg.Setup += "; " + stmt
					case "apply":
						cfg.Apply = stmt
					case "reject":
						cfg.Reject = stmt + " RETURNING 'x'"
					case "emit":
						cfg.Emit = stmt + " RETURNING 'k' AS key, 'v' AS value"
					}
					if table == "sqlite_stat1" {
						// SQLite makes sqlite_stat1 on ANALYZE only: make it
						// as a user might, which is refused in itself.
						cfg.Setup += "; CREATE TABLE sqlite_stat1 (tbl, idx, stat)"
					}
					err := sqlproc.Check(ctx, cfg)
					if table == "sqlite_stat1" {
						if err == nil || !strings.Contains(err.Error(), "sqlite_stat1") {
							t.Fatalf("Check() = %v, want a refusal naming sqlite_stat1", err)
						}
						return
					}
					if err == nil || !strings.HasSuffix(err.Error(), want) || !strings.HasPrefix(err.Error(), "sqlproc p: "+field) {
						t.Fatalf("Check() = %v\nwant the %s statement refused: %s", err, field, want)
					}
				})
			}
		}
	}

	// The outbox view cannot be written at all: the guard or SQLite
	// refuses it, in every statement and from a trigger alike.
	refusedView := func(err error) bool {
		return err != nil && (strings.HasSuffix(err.Error(), "cannot modify outbox because it is a view") ||
			strings.HasSuffix(err.Error(), "writes outboxd's table outbox (user SQL may read outboxd's tables, never write them)"))
	}
	for op, stmt := range map[string]string{
		"Insert": "INSERT INTO outbox DEFAULT VALUES",
		"Update": "UPDATE outbox SET id = id WHERE :account IS NULL",
		"Delete": "DELETE FROM main.OUTBOX WHERE :amount IS NULL",
	} {
		t.Run("outbox/"+op, func(t *testing.T) {
			cfg := csvConfig()
			cfg.Apply = stmt
			err := sqlproc.Check(ctx, cfg)
			if !refusedView(err) {
				t.Fatalf("Check() = %v\nwant the statement refused", err)
			}
		})
	}
	t.Run("outbox/Trigger", func(t *testing.T) {
		cfg := csvConfig()
		cfg.Setup += "; CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM outbox; END"
		if err := sqlproc.Check(ctx, cfg); !refusedView(err) {
			t.Fatalf("Check() = %v, want the trigger's write refused", err)
		}
	})

	trigger := func(table string) string {
		return fmt.Sprintf("CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM %s; END", table)
	}
	insteadOf := func(table string) string {
		return fmt.Sprintf("CREATE VIEW v AS SELECT account, n FROM t; "+
			"CREATE TRIGGER vt INSTEAD OF INSERT ON v BEGIN UPDATE %s SET %s = %[2]s; END", table, aColumn[table])
	}
	for _, table := range schemaTables {
		t.Run(table+"/Trigger", func(t *testing.T) {
			cfg := csvConfig()
			cfg.Setup += "; " + trigger(table)
			err := sqlproc.Check(ctx, cfg)
			want := "sqlproc p: apply (INSERT INTO t VALUES (:account, :amount) ON CONF ...): trigger or view tr writes outboxd's table " + table
			if err == nil || err.Error() != want {
				t.Fatalf("Check() = %v\nwant %s", err, want)
			}
		})
		t.Run(table+"/ViewInsteadOfTrigger", func(t *testing.T) {
			cfg := csvConfig()
			cfg.Setup += "; " + insteadOf(table)
			cfg.Apply = "INSERT INTO v VALUES (:account, :amount)"
			err := sqlproc.Check(ctx, cfg)
			want := "sqlproc p: apply (INSERT INTO v VALUES (:account, :amount)): trigger or view vt writes outboxd's table " + table
			if err == nil || err.Error() != want {
				t.Fatalf("Check() = %v\nwant %s", err, want)
			}
		})
	}
	for _, table := range append(schemaTables, "outbox") {
		for name, stmt := range map[string]string{
			"CreateTrigger":       fmt.Sprintf("CREATE TRIGGER x AFTER INSERT ON %s BEGIN SELECT 1; END", table),
			"CreateTempTrigger":   fmt.Sprintf("CREATE TEMP TRIGGER x AFTER INSERT ON %s BEGIN SELECT 1; END", table),
			"CreateTempTable":     fmt.Sprintf("CREATE TEMP TABLE %s (x)", table),
			"CreateTempView":      fmt.Sprintf("CREATE TEMP VIEW %s AS SELECT 1", table),
			"CreateTable":         fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (x)", table),
			"CreateIndex":         fmt.Sprintf("CREATE INDEX x ON %s (rowid)", table),
			"DropTable":           fmt.Sprintf("DROP TABLE %s", table),
			"AlterTable":          fmt.Sprintf("ALTER TABLE %s ADD COLUMN x", table),
			"Rename":              fmt.Sprintf("ALTER TABLE %s RENAME TO x", table),
			"CreateIndexSameName": fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON t (n)", table),
		} {
			t.Run(table+"/"+name, func(t *testing.T) {
				cfg := csvConfig()
				cfg.Setup += "; " + stmt
				err := sqlproc.Check(ctx, cfg)
				if err == nil || !strings.HasPrefix(err.Error(), "sqlproc p: setup statement 2 (") || !strings.Contains(err.Error(), table) {
					t.Fatalf("Check() = %v, want setup statement 2 refused, naming %s", err, table)
				}
			})
		}
	}

	for _, c := range []struct{ name, setup, apply, err string }{
		{"Pragma", "PRAGMA foreign_keys = off", "",
			"sqlproc p: setup statement 2 (PRAGMA foreign_keys = off): PRAGMA foreign_keys: user SQL may only run the pragmas that describe the schema"},
		{"PragmaWritableSchema", "PRAGMA writable_schema = 1", "",
			"sqlproc p: setup statement 2 (PRAGMA writable_schema = 1): PRAGMA writable_schema: user SQL may only run the pragmas that describe the schema"},
		{"PragmaUserVersion", "PRAGMA user_version = 1", "",
			"sqlproc p: setup statement 2 (PRAGMA user_version = 1): PRAGMA user_version: user SQL may only run the pragmas that describe the schema"},
		{"Attach", "ATTACH 'x.db' AS x", "", "sqlproc p: setup statement 2 (ATTACH 'x.db' AS x): ATTACH: user SQL works on outboxd's database alone"},
		{"Analyze", "ANALYZE", "", "sqlproc p: setup statement 2 (ANALYZE): ANALYZE: its statistics would steer outboxd's own queries"},
		{"DBPage", "CREATE VIRTUAL TABLE p USING sqlite_dbpage", "",
			"sqlproc p: setup statement 2 (CREATE VIRTUAL TABLE p USING sqlite_dbpage): creates a virtual table over the database's raw pages"},
		{"WriteDBPage", "", "INSERT INTO sqlite_dbpage VALUES (1, zeroblob(4096))",
			"sqlproc p: apply (INSERT INTO sqlite_dbpage VALUES (1, zeroblob(40 ...): writes outboxd's table sqlite_dbpage (user SQL may read outboxd's tables, never write them)"},
		{"Begin", "", "BEGIN", "sqlproc p: apply (BEGIN): BEGIN: each item runs in outboxd's own transaction"},
		{"Commit", "", "COMMIT", "sqlproc p: apply (COMMIT): COMMIT: each item runs in outboxd's own transaction"},
		{"Savepoint", "", "SAVEPOINT x", "sqlproc p: apply (SAVEPOINT x): SAVEPOINT/RELEASE: each item runs in outboxd's own savepoint"},
		{"ReleaseItem", "", "RELEASE item", "sqlproc p: apply (RELEASE item): SAVEPOINT/RELEASE: each item runs in outboxd's own savepoint"},
		{"OrdersTable", "", "DELETE FROM orders_status", "sqlproc p: apply (DELETE FROM orders_status): no such table: orders_status"},
		{"CreateOrdersTable", "CREATE TABLE IF NOT EXISTS orders_status (x)", "",
			"sqlproc p: setup statement 2 (CREATE TABLE IF NOT EXISTS orders_status (x)): creates orders_status, which is outboxd's"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := csvConfig()
			if c.setup != "" {
				cfg.Setup += "; " + c.setup
			}
			if c.apply != "" {
				cfg.Apply = c.apply
			}
			err := sqlproc.Check(ctx, cfg)
			if err == nil || err.Error() != c.err {
				t.Fatalf("Check() = %v\nwant %s", err, c.err)
			}
		})
	}
}

// TestCheck_Allowed: what user SQL may do with outboxd's tables and its own.
func TestCheck_Allowed(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ name, setup, apply, emit string }{
		{"ReadOutboxdTables", "", "",
			"SELECT :account AS key, (SELECT count(*) FROM outbox) || '/' || (SELECT count(*) FROM positions) AS value"},
		{"ReadThroughView", "CREATE VIEW IF NOT EXISTS pending AS SELECT id FROM outbox", "",
			"SELECT :account AS key, CAST(count(*) AS TEXT) AS value FROM pending"},
		{"OwnAutoincrement", "CREATE TABLE a (id INTEGER PRIMARY KEY AUTOINCREMENT, v); INSERT INTO a (v) VALUES (1); " +
			"ALTER TABLE a RENAME TO b; DROP TABLE b", "", ""},
		{"OwnTriggerAndIndex", "CREATE INDEX IF NOT EXISTS t_n ON t (n); CREATE TABLE IF NOT EXISTS log (a); " +
			"CREATE TRIGGER IF NOT EXISTS tl AFTER UPDATE ON t BEGIN INSERT INTO log VALUES (new.account); END", "", ""},
		{"DescribingPragmas", "PRAGMA table_info(outbox); PRAGMA index_list(t)", "",
			"SELECT :account AS key, group_concat(name) AS value FROM pragma_table_info('outbox')"},
		{"ConflictClauses", "", "INSERT OR REPLACE INTO t VALUES (:account, :amount); INSERT OR IGNORE INTO t VALUES (:account, 0); " +
			"UPDATE OR FAIL t SET n = n WHERE account = :account", ""},
		{"TempTableOfItsOwn", "CREATE TEMP TABLE IF NOT EXISTS scratch (x)", "INSERT INTO scratch VALUES (:position)", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := csvConfig()
			if c.setup != "" {
				cfg.Setup += "; " + c.setup
			}
			if c.apply != "" {
				cfg.Apply = c.apply
			}
			if c.emit != "" {
				cfg.Emit = c.emit
			}
			if err := sqlproc.Check(ctx, cfg); err != nil {
				t.Fatalf("Check() = %v", err)
			}
		})
	}
}
