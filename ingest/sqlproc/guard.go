package sqlproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"modernc.org/sqlite"

	"github.com/outboxd/outboxd/outbox"
)

// BuiltinTables are the tables built-in processors create in their Setup
// (not in outboxd's schema): protected like the schema's own.
var BuiltinTables = []string{"orders_events", "orders_status", "orders_events_place"}

// sqliteTables are SQLite's own tables a statement could write. The schema
// table itself is not among them: SQLite refuses writes to it unless
// PRAGMA writable_schema is on, which user SQL may not set, and every
// CREATE and DROP is presented to the authorizer as a write to it.
var sqliteTables = []string{"sqlite_sequence", "sqlite_stat1", "sqlite_stat2", "sqlite_stat3", "sqlite_stat4", "sqlite_dbpage"}

// protectedSet is what user SQL must never write: every name outboxd's
// schema creates, SQLite's own tables and the built-in processors' tables.
type protectedSet struct {
	names    map[string]bool // lower case
	triggers map[string]bool // outboxd's own triggers, lower case
}

func (p protectedSet) has(name string) bool { return p.names[strings.ToLower(name)] }

// protected computes the set once per process, from a database made by
// outboxd's own migrations: it holds exactly the schema's names, whatever
// migrations are added.
var protected = sync.OnceValues(func() (protectedSet, error) {
	ctx := context.Background()
	p := protectedSet{names: map[string]bool{}, triggers: map[string]bool{}}
	err := withScratch(ctx, func(s *outbox.Store) error {
		objs, err := schemaObjects(ctx, s)
		if err != nil {
			return err
		}
		for _, o := range objs {
			p.names[strings.ToLower(o.Name)] = true
			if o.Type == "trigger" {
				p.triggers[strings.ToLower(o.Name)] = true
			}
		}
		return nil
	})
	if err != nil {
		return p, fmt.Errorf("outboxd's table names: %w", err)
	}
	for _, n := range append(append([]string{}, sqliteTables...), BuiltinTables...) {
		p.names[n] = true
	}
	return p, nil
})

type schemaObject struct {
	Type string `db:"type"`
	Name string `db:"name"`
}

func schemaObjects(ctx context.Context, s *outbox.Store) ([]schemaObject, error) {
	tx, err := s.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	var objs []schemaObject
	if err := tx.Select(ctx, &objs, `SELECT type, name FROM sqlite_schema`); err != nil {
		return nil, fmt.Errorf("read the schema: %w", err)
	}
	return objs, nil
}

// withScratch runs f on a new store in a temporary directory, removed
// afterwards.
func withScratch(ctx context.Context, f func(s *outbox.Store) error) error {
	dir, err := os.MkdirTemp("", "outboxd-sqlproc-")
	if err != nil {
		return fmt.Errorf("scratch database: %w", err)
	}
	defer os.RemoveAll(dir)
	cfg := outbox.DefaultConfig(filepath.Join(dir, "check.db"))
	cfg.Synchronous = outbox.SyncNormal // nothing in it is kept
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		return fmt.Errorf("scratch database: %w", err)
	}
	defer s.Close()
	return f(s)
}

// Guard installs on the store's writer connection the authorizer that
// keeps user SQL out of outboxd's tables at run time, whatever the
// database's schema has come to hold. A SQL processor's Setup fails on a
// store without it. Call it once after opening the store, before any loop
// starts (it waits for the writer connection).
//
// Every statement of a SQL processor is checked in full when the processor
// is made (see Check). What Check cannot see is the real database's
// schema, which may hold triggers that a statement's writes fire; so,
// for every statement compiled on the connection, outboxd's included, the
// guard refuses: a write to a protected table from inside a trigger that
// is not outboxd's; a trigger on a protected table; a temporary table,
// view, index or trigger with a protected name (unqualified names look in
// "temp" first, so it would capture outboxd's own statements); a virtual
// table over sqlite_dbpage (raw pages). outboxd's own statements do none
// of these, so the guard never stands in their way.
func Guard(ctx context.Context, s *outbox.Store) error {
	p, err := protected()
	if err != nil {
		return err
	}
	g := &guard{set: p}
	if err := s.SetAuthorizer(ctx, g.allowEngine); err != nil {
		return fmt.Errorf("install the SQL guard: %w", err)
	}
	return nil
}

// probeGuard is compiled, never run, by Setup: the guard refuses it, so
// its success means the store has no guard.
const probeGuard = `EXPLAIN CREATE TEMP TABLE outbox (x)`

// errNoGuard says a store runs user SQL without the guard.
var errNoGuard = errors.New("the store has no SQL guard: call sqlproc.Guard after opening it")

// guard judges the operations SQLite presents while compiling statements.
type guard struct {
	set     protectedSet
	foreign map[string]foreignTable // Check: the tables of the processors read, lower case

	mu     sync.Mutex
	user   bool   // allowUser judges: a user's statement is being compiled
	denied string // the last refusal, for the error that follows it
	ddl    bool   // the statement being checked drops or alters a table
}

// asUser runs f, which compiles one user statement, under the rule for
// user SQL; the store's own statements around it (BEGIN, COMMIT) are
// judged as the engine's. It returns what the guard refused last, if
// anything.
func (g *guard) asUser(f func() error) (denied string, err error) {
	g.mu.Lock()
	g.user, g.denied, g.ddl = true, "", false
	g.mu.Unlock()
	err = f()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.user = false
	return g.denied, err
}

func (g *guard) userMode() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.user
}

// refuse records why an operation was refused and refuses it.
func (g *guard) refuse(format string, args ...any) bool {
	g.mu.Lock()
	g.denied = fmt.Sprintf(format, args...)
	g.mu.Unlock()
	return false
}

// allowEngine is the rule for every statement on a store running user SQL.
func (g *guard) allowEngine(r outbox.AuthRequest) bool {
	switch r.Action {
	case sqlite.AuthInsert, sqlite.AuthUpdate, sqlite.AuthDelete:
		if r.Inside != "" && g.set.has(r.Arg1) && !g.set.triggers[strings.ToLower(r.Inside)] {
			return g.refuse("trigger or view %s writes outboxd's table %s", r.Inside, r.Arg1)
		}
	case sqlite.AuthCreateTrigger, sqlite.AuthCreateTempTrigger:
		if g.set.has(r.Arg2) {
			return g.refuse("creates trigger %s on outboxd's table %s", r.Arg1, r.Arg2)
		}
		if r.Action == sqlite.AuthCreateTempTrigger && g.set.has(r.Arg1) {
			return g.refuse("creates a temporary trigger named like outboxd's %s", r.Arg1)
		}
	case sqlite.AuthCreateTempTable, sqlite.AuthCreateTempView, sqlite.AuthCreateTempIndex:
		if g.set.has(r.Arg1) {
			return g.refuse("creates a temporary %s that would hide outboxd's", r.Arg1)
		}
	case sqlite.AuthCreateVTable:
		if strings.EqualFold(r.Arg2, "sqlite_dbpage") {
			return g.refuse("creates a virtual table over the database's raw pages")
		}
	}
	return true
}

// readOnlyPragmas are the pragmas user SQL may run: they only describe.
var readOnlyPragmas = map[string]bool{
	"table_info": true, "table_xinfo": true, "table_list": true, "index_info": true,
	"index_xinfo": true, "index_list": true, "foreign_key_list": true, "collation_list": true,
	"function_list": true, "module_list": true, "pragma_list": true, "database_list": true,
	"compile_options": true,
}

// allowUser is the rule for user SQL, under which Check compiles every
// statement of a processor: no write, creation, change or removal of a
// protected table, index, view or trigger; no transaction control (each
// item runs in outboxd's savepoint); no ATTACH or DETACH; no pragma but
// those that describe; no ANALYZE (its statistics steer outboxd's
// queries too); no extension loading.
func (g *guard) allowUser(r outbox.AuthRequest) bool {
	if !g.allowEngine(r) {
		return false
	}
	if !g.userMode() {
		return true
	}
	if denied, ok := g.foreignRule(r); !ok {
		return g.refuse("%s", denied)
	}
	switch r.Action {
	case sqlite.AuthInsert, sqlite.AuthUpdate, sqlite.AuthDelete:
		if !g.set.has(r.Arg1) {
			return true
		}
		// DROP TABLE and ALTER TABLE ... RENAME of a user's AUTOINCREMENT
		// table update sqlite_sequence themselves.
		if strings.EqualFold(r.Arg1, "sqlite_sequence") && r.Inside == "" && g.droppingOrAltering() {
			return true
		}
		return g.refuse("writes outboxd's table %s (user SQL may read outboxd's tables, never write them)", r.Arg1)
	case sqlite.AuthCreateTable, sqlite.AuthCreateView, sqlite.AuthCreateVTable, sqlite.AuthDropTable,
		sqlite.AuthDropView, sqlite.AuthDropVTable, sqlite.AuthDropTempTable, sqlite.AuthDropTempView:
		if g.set.has(r.Arg1) {
			return g.refuse("%s %s, which is outboxd's", verb(r.Action), r.Arg1)
		}
		if r.Action == sqlite.AuthDropTable {
			g.setDDL()
		}
	case sqlite.AuthCreateIndex, sqlite.AuthDropIndex, sqlite.AuthDropTempIndex,
		sqlite.AuthDropTrigger, sqlite.AuthDropTempTrigger:
		if g.set.has(r.Arg1) || g.set.has(r.Arg2) {
			return g.refuse("%s %s on outboxd's table %s", verb(r.Action), r.Arg1, r.Arg2)
		}
	case sqlite.AuthCreateTrigger:
		if g.set.has(r.Arg1) {
			return g.refuse("creates a trigger named like outboxd's %s", r.Arg1)
		}
	case sqlite.AuthAlterTable:
		if g.set.has(r.Arg2) {
			return g.refuse("alters outboxd's table %s", r.Arg2)
		}
		g.setDDL()
	case sqlite.AuthTransaction:
		return g.refuse("%s: each item runs in outboxd's own transaction", r.Arg1)
	case sqlite.AuthSavepoint:
		return g.refuse("SAVEPOINT/RELEASE: each item runs in outboxd's own savepoint")
	case sqlite.AuthAttach, sqlite.AuthDetach:
		return g.refuse("%s: user SQL works on outboxd's database alone", verb(r.Action))
	case sqlite.AuthAnalyze:
		return g.refuse("ANALYZE: its statistics would steer outboxd's own queries")
	case sqlite.AuthPragma:
		// ALTER TABLE ... ADD COLUMN on a STRICT table, or with a NOT NULL
		// or CHECK constraint, checks the table's rows through
		// pragma_quick_check: SQLite's own read, allowed there.
		if strings.EqualFold(r.Arg1, "quick_check") && g.droppingOrAltering() {
			return true
		}
		if !readOnlyPragmas[strings.ToLower(r.Arg1)] {
			return g.refuse("PRAGMA %s: user SQL may only run the pragmas that describe the schema", r.Arg1)
		}
	case sqlite.AuthFunction:
		if strings.EqualFold(r.Arg2, "load_extension") {
			return g.refuse("load_extension: no extensions")
		}
	}
	return true
}

func (g *guard) setDDL() {
	g.mu.Lock()
	g.ddl = true
	g.mu.Unlock()
}

func (g *guard) droppingOrAltering() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ddl
}

func verb(a sqlite.AuthorizerActionCode) string {
	switch a {
	case sqlite.AuthCreateTable, sqlite.AuthCreateView, sqlite.AuthCreateVTable:
		return "creates"
	case sqlite.AuthCreateIndex:
		return "creates index"
	case sqlite.AuthCreateTrigger, sqlite.AuthCreateTempTrigger:
		return "creates trigger"
	case sqlite.AuthDropIndex, sqlite.AuthDropTempIndex:
		return "drops index"
	case sqlite.AuthDropTrigger, sqlite.AuthDropTempTrigger:
		return "drops trigger"
	case sqlite.AuthAttach:
		return "ATTACH"
	case sqlite.AuthDetach:
		return "DETACH"
	}
	return "drops"
}

// foreignRule judges user SQL's use of another feed's tables: read when
// Reads names them, never written, altered, dropped, indexed or given a
// trigger.
func (g *guard) foreignRule(r outbox.AuthRequest) (string, bool) {
	if len(g.foreign) == 0 {
		return "", true
	}
	table := func(name string) (foreignTable, bool) {
		f, ok := g.foreign[strings.ToLower(name)]
		return f, ok
	}
	switch r.Action {
	case sqlite.AuthRead:
		if f, ok := table(r.Arg1); ok && !f.readable {
			return fmt.Sprintf("reads table %s of feed %s, which reads does not name", r.Arg1, f.feed), false
		}
	case sqlite.AuthInsert, sqlite.AuthUpdate, sqlite.AuthDelete:
		if f, ok := table(r.Arg1); ok {
			return fmt.Sprintf("writes table %s of feed %s (another feed's tables are read, never written)", r.Arg1, f.feed), false
		}
	case sqlite.AuthDropTable, sqlite.AuthDropView:
		if f, ok := table(r.Arg1); ok {
			return fmt.Sprintf("drops table %s of feed %s, which only its own processor changes", r.Arg1, f.feed), false
		}
	case sqlite.AuthAlterTable:
		if f, ok := table(r.Arg2); ok {
			return fmt.Sprintf("alters table %s of feed %s, which only its own processor changes", r.Arg2, f.feed), false
		}
	case sqlite.AuthCreateIndex, sqlite.AuthDropIndex, sqlite.AuthCreateTrigger, sqlite.AuthDropTrigger,
		sqlite.AuthCreateTempTrigger:
		if f, ok := table(r.Arg2); ok {
			return fmt.Sprintf("%s %s on table %s of feed %s, which only its own processor changes", verb(r.Action), r.Arg1, r.Arg2, f.feed), false
		}
	}
	return "", true
}
