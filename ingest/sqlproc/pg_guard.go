package sqlproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/outboxd/outboxd/internal/sqllex"
	"github.com/outboxd/outboxd/outbox"
)

// The guard on PostgreSQL. SQLite's authorizer has no counterpart there,
// so what a processor's SQL may do is judged at Setup, on the database it
// will run on, from two things: the statement's kind (its leading words)
// and the relations PostgreSQL's planner says it writes.
//
//   - setup and migrations: CREATE TABLE, CREATE [UNIQUE] INDEX, ALTER
//     TABLE, DROP TABLE, DROP INDEX, INSERT, UPDATE, DELETE; the table
//     named must not be outboxd's (the SQLite guard's protected names:
//     outboxd's schema and the built-in processors' tables). No functions,
//     triggers, rules, roles, grants, SET, COPY, DO or CALL.
//   - reject, apply, emit: SELECT, INSERT, UPDATE, DELETE, WITH or VALUES,
//     each PREPAREd (a syntax error or a missing table or column fails the
//     start, naming the statement, with PostgreSQL's message) and its
//     generic plan read with EXPLAIN (VERBOSE, FORMAT JSON): every
//     ModifyTable node (a write, data-modifying WITH included) must write
//     a table the processor's own setup or migrations create.
//
// The statements are fixed at start, so what the check saw is what runs.

// errSQLiteInsert refuses SQLite's conflict clauses of INSERT.
var errSQLiteInsert = errors.New("INSERT OR IGNORE/REPLACE and REPLACE INTO are SQLite's: on PostgreSQL write INSERT ... ON CONFLICT DO NOTHING or DO UPDATE")

// pgRunKinds are the leading words of a statement run for an item.
var pgRunKinds = []string{"SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "VALUES"}

// words are the first n words of text, upper case (quoted identifiers and
// literals as they are).
func words(text string, n int) []string {
	var ws []string
	for i := 0; i < len(text) && len(ws) < n; {
		t, err := sqllex.Next(text[i:])
		if err != nil || t.Text == "" {
			break
		}
		i += len(t.Text)
		switch t.Kind {
		case sqllex.Space:
		case sqllex.Word:
			ws = append(ws, strings.ToUpper(t.Text))
		default:
			ws = append(ws, t.Text)
		}
	}
	return ws
}

// unquote is an identifier as PostgreSQL folds it: lower case unless
// quoted; a schema before it is dropped.
func unquote(id string) string {
	if i := strings.LastIndexByte(id, '.'); i >= 0 && !strings.HasSuffix(id, `"`) {
		id = id[i+1:]
	}
	if len(id) >= 2 && id[0] == '"' && id[len(id)-1] == '"' {
		return strings.ReplaceAll(id[1:len(id)-1], `""`, `"`)
	}
	return strings.ToLower(id)
}

// pgSetupTarget is the table a setup or migration statement changes, and
// whether the statement is one it creates; an error for a kind of
// statement the guard does not allow.
func pgSetupTarget(text string) (table string, creates bool, err error) {
	ws := words(text, 12)
	skip := func(i int, opt ...string) int {
		for i < len(ws) && slices.Contains(opt, ws[i]) {
			i++
		}
		return i
	}
	at := func(i int) string {
		if i < len(ws) {
			return unquote(ws[i])
		}
		return ""
	}
	kind := strings.Join(ws[:min(2, len(ws))], " ")
	switch {
	case kind == "CREATE TABLE":
		return at(skip(2, "IF", "NOT", "EXISTS")), true, nil
	case kind == "CREATE INDEX" || kind == "CREATE UNIQUE":
		i := slices.Index(ws, "ON")
		if i < 0 {
			return "", false, fmt.Errorf("CREATE INDEX without ON")
		}
		return at(skip(i+1, "ONLY")), false, nil
	case kind == "ALTER TABLE" || kind == "DROP TABLE":
		return at(skip(2, "IF", "EXISTS", "ONLY")), false, nil
	case kind == "DROP INDEX":
		return "", false, nil // an index of a table the processor owns: PostgreSQL refuses one it may not drop
	case kind == "INSERT OR" || kind == "REPLACE INTO":
		return "", false, errSQLiteInsert
	case len(ws) > 0 && ws[0] == "INSERT":
		return at(skip(1, "INTO")), false, nil
	case len(ws) > 0 && ws[0] == "UPDATE":
		return at(skip(1, "ONLY")), false, nil
	case len(ws) > 0 && ws[0] == "DELETE":
		return at(skip(1, "FROM", "ONLY")), false, nil
	}
	return "", false, fmt.Errorf("%s: on PostgreSQL, setup and migrations hold CREATE TABLE, CREATE INDEX, ALTER TABLE, DROP TABLE, DROP INDEX, INSERT, UPDATE and DELETE only", kind)
}

// pgOwnTables checks the kinds and targets of p's setup and migration
// statements and returns the tables they create, which p's statements may
// write: a statement that changes a table must change one of these, and
// none of them may have outboxd's name.
func (p *plan) pgOwnTables() ([]string, error) {
	set, err := protected()
	if err != nil {
		return nil, fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
	}
	type target struct {
		name, table string
	}
	var own []string
	var changed []target
	check := func(field string, i, n int, s statement) error {
		name := stmtName(field, i, n, s.text)
		table, creates, err := pgSetupTarget(s.text)
		switch {
		case err != nil:
			return fmt.Errorf("sqlproc %s: %s: %w", p.cfg.Name, name, err)
		case set.has(table):
			return fmt.Errorf("sqlproc %s: %s: changes outboxd's table %s (user SQL may read outboxd's tables, never write them)",
				p.cfg.Name, name, table)
		case creates:
			own = append(own, table)
		case table != "":
			changed = append(changed, target{name, table})
		}
		return nil
	}
	for i, s := range p.setup {
		if err := check("setup", i, len(p.setup), s); err != nil {
			return nil, err
		}
	}
	for _, m := range p.migs {
		for i, s := range m.stmts {
			if err := check(m.field(), i, len(m.stmts), s); err != nil {
				return nil, err
			}
		}
	}
	for _, c := range changed {
		if !slices.Contains(own, c.table) {
			return nil, fmt.Errorf("sqlproc %s: %s: changes table %s, which is not the processor's own (%s)", p.cfg.Name, c.name, c.table, ownList(own))
		}
	}
	return own, nil
}

// ownList says which tables a processor's setup and migrations create.
func ownList(own []string) string {
	if len(own) == 0 {
		return "its setup and migrations create none"
	}
	return "its setup and migrations create " + strings.Join(own, ", ")
}

// pgOwnerNote is the comment Setup puts on each table a processor
// creates, which says whose it is: a CREATE TABLE IF NOT EXISTS of a name
// that another processor's table (or any other) holds already would
// otherwise make it this one's.
func pgOwnerNote(processor string) string { return "outboxd: sqlproc " + processor }

// pgClaimCheck refuses, before p's setup runs, a table p creates that
// exists already without p's note.
func (p *Processor) pgClaimCheck(ctx context.Context, tx *outbox.Tx, own []string) error {
	for _, t := range own {
		var note struct {
			Exists bool    `db:"found"`
			Note   *string `db:"note"`
		}
		if err := tx.Get(ctx, &note, `SELECT to_regclass(quote_ident(?)) IS NOT NULL AS found, obj_description(to_regclass(quote_ident(?)), 'pg_class') AS note`, t, t); err != nil {
			return fmt.Errorf("sqlproc %s: look up table %s: %w", p.Name(), t, err)
		}
		if note.Exists && (note.Note == nil || *note.Note != pgOwnerNote(p.Name())) {
			return fmt.Errorf("sqlproc %s: its setup creates table %s, which exists and is not the processor's own (it has no comment %q)", p.Name(), t, pgOwnerNote(p.Name()))
		}
	}
	return nil
}

// pgClaim notes, after p's setup and migrations ran, each table they
// created as p's.
func (p *Processor) pgClaim(ctx context.Context, tx *outbox.Tx, own []string) error {
	for _, t := range own {
		var found bool
		if err := tx.Get(ctx, &found, `SELECT to_regclass(quote_ident(?)) IS NOT NULL`, t); err != nil {
			return fmt.Errorf("sqlproc %s: look up table %s: %w", p.Name(), t, err)
		}
		if !found {
			continue // a migration dropped it
		}
		note := strings.ReplaceAll(pgOwnerNote(p.Name()), "'", "''")
		if _, err := tx.Exec(ctx, `COMMENT ON TABLE `+quoteIdent(t)+` IS '`+note+`'`); err != nil {
			return fmt.Errorf("sqlproc %s: note table %s as its own: %w", p.Name(), t, err)
		}
	}
	return nil
}

// quoteIdent is name as a quoted PostgreSQL identifier.
func quoteIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// pgCheck PREPAREs each of p's item statements in tx and refuses, naming
// it, one whose kind is not a run statement's, one PostgreSQL cannot
// prepare, or one whose plan writes a table that is not one of own.
func (p *Processor) pgCheck(ctx context.Context, tx *outbox.Tx, own []string) error {
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		return fmt.Errorf("sqlproc %s: %w", p.Name(), err)
	}
	for _, r := range p.statements() {
		text := r.stmt.String()
		ws := words(text, 2)
		if k := strings.Join(ws, " "); k == "INSERT OR" || k == "REPLACE INTO" {
			return fmt.Errorf("sqlproc %s: %s: %w", p.Name(), r.name, errSQLiteInsert)
		}
		if len(ws) == 0 || !slices.Contains(pgRunKinds, ws[0]) {
			return fmt.Errorf("sqlproc %s: %s: on PostgreSQL, a statement run for an item is a SELECT, INSERT, UPDATE, DELETE, WITH or VALUES", p.Name(), r.name)
		}
		writes, err := pgWrites(ctx, tx, text, len(r.slots))
		if err != nil {
			return fmt.Errorf("sqlproc %s: %s: %s", p.Name(), r.name, pgMessage(err))
		}
		for _, w := range writes {
			if !slices.Contains(own, w) {
				return fmt.Errorf("sqlproc %s: %s: writes table %s, which is not the processor's own (%s)", p.Name(), r.name, w, ownList(own))
			}
		}
	}
	_, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode TO DEFAULT`)
	return err
}

// pgPlans numbers the prepared statements pgWrites makes and removes: a
// prepared statement is the session's, not the transaction's, so one left
// by a failed check must not be in the way of the next.
var pgPlans atomic.Int64

// pgWrites PREPAREs text (n parameters) in tx and returns the tables its
// generic plan writes.
func pgWrites(ctx context.Context, tx *outbox.Tx, text string, n int) ([]string, error) {
	pgPlanName := "outboxd_sqlproc_check_" + strconv.FormatInt(pgPlans.Add(1), 10)
	if _, err := tx.Exec(ctx, `PREPARE `+pgPlanName+` AS `+text); err != nil {
		return nil, err
	}
	explain := `EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE ` + pgPlanName
	if n > 0 {
		explain += `(` + strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ") + `)`
	}
	var plan string
	if err := tx.Get(ctx, &plan, explain); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `DEALLOCATE `+pgPlanName); err != nil {
		return nil, err
	}
	var doc []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(plan), &doc); err != nil {
		return nil, fmt.Errorf("read the plan: %w", err)
	}
	var writes []string
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.NodeType == "ModifyTable" && n.Relation != "" && !slices.Contains(writes, n.Relation) {
			writes = append(writes, n.Relation)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	for _, d := range doc {
		walk(d.Plan)
	}
	return writes, nil
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan, as far as the guard
// reads it.
type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Plans    []planNode `json:"Plans"`
}
