// Package pgtable relays the outbox into PostgreSQL tables, exactly once.
//
// Each Deliver is one PostgreSQL transaction that writes the rows into
// their tables and moves the sink's progress row (a table of its own,
// outboxd_sink_progress by default) past them. After any crash the
// transaction is either whole or absent, and Resume reads the progress
// row: every output is in its table exactly once. The progress row is
// locked (SELECT ... FOR UPDATE) at the start of each transaction, so two
// processes relaying the same sink write each row once between them.
//
// A row the table refuses (a value that is not JSON for a jsonb column,
// a row that breaks a constraint of the table, an upsert without a key)
// is a dead letter with its reason; the others go on. The refusal is kept
// beside the progress row (outboxd_sink_refused) until a later Deliver
// shows the runner has stored it, so a crash between the commit and the
// runner's dead letter never loses it: Resume goes back to before the
// oldest refusal kept, and Deliver returns it again.
package pgtable

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
)

// Mode is how rows are written into a table.
type Mode string

const (
	// Insert adds one row per output, keyed by its outbox id.
	Insert Mode = "insert"
	// Upsert keeps one row per output key: the last output of each key.
	Upsert Mode = "upsert"
)

// ValueType is the type of the value column.
type ValueType string

const (
	// JSONB stores the value as jsonb; a value that is not JSON is a dead
	// letter.
	JSONB ValueType = "jsonb"
	// Bytea stores the value's bytes as they are.
	Bytea ValueType = "bytea"
	// Auto stores a JSON value in value (jsonb) and any other in
	// value_bytes (bytea), the other column NULL.
	Auto ValueType = "auto"
)

// Dead letter reasons of rows a table refuses.
const (
	ReasonNotJSON = "not-json"         // the value is not JSON and the column is jsonb
	ReasonNoKey   = "no-key"           // an upsert of an output without a key
	ReasonRefused = "refused-by-table" // PostgreSQL refused the row (a type, a constraint)
)

// DefaultTable, DefaultProgressTable and DefaultRefusedTable are the
// tables used when the configuration names none.
const (
	DefaultTable         = "outboxd_outputs"
	DefaultProgressTable = "outboxd_sink_progress"
	DefaultRefusedTable  = "outboxd_sink_refused"
)

// Config is one PostgreSQL sink.
type Config struct {
	// DSN connects to the database (postgres:// URL or key=value pairs).
	DSN string
	// Sink names the sink: its progress row and refusals go by it.
	Sink string
	// Table is the table of topics Tables does not name (default
	// DefaultTable); a name may be schema-qualified (schema.table).
	Table string
	// Tables maps output topics to their own tables.
	Tables map[string]string
	// Mode is Insert (default) or Upsert.
	Mode Mode
	// Value is the value column's type: JSONB (default), Bytea or Auto.
	Value ValueType
	// Create creates missing tables; otherwise a table must exist with
	// the columns this sink writes, of their types.
	Create bool
	// ProgressTable and RefusedTable hold the sink's progress row and the
	// refusals not yet known stored (defaults DefaultProgressTable,
	// DefaultRefusedTable); they are always created when missing.
	ProgressTable, RefusedTable string
	// MaxConns bounds the connections to the database (default 2).
	MaxConns int32
	// Logger logs (default slog.Default()).
	Logger *slog.Logger
}

var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// parseTable splits a possibly schema-qualified table name.
func parseTable(name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("table %q: want TABLE or SCHEMA.TABLE", name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return nil, fmt.Errorf("table %q: each part is a letter or _ then letters, digits, _ or $ (at most 63)", name)
		}
	}
	return pgx.Identifier(parts), nil
}

func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Mode == "" {
		c.Mode = Insert
	}
	if c.Value == "" {
		c.Value = JSONB
	}
	if c.ProgressTable == "" {
		c.ProgressTable = DefaultProgressTable
	}
	if c.RefusedTable == "" {
		c.RefusedTable = DefaultRefusedTable
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 2
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Check reports a mistake in c without connecting.
func (c Config) Check() error {
	c = c.withDefaults()
	if c.Sink == "" {
		return errors.New("pgtable: no sink name")
	}
	if _, err := pgxpool.ParseConfig(c.DSN); err != nil {
		return fmt.Errorf("pgtable: DSN: %w", err)
	}
	switch c.Mode {
	case Insert, Upsert:
	default:
		return fmt.Errorf("pgtable: mode %q: want insert or upsert", c.Mode)
	}
	switch c.Value {
	case JSONB, Bytea, Auto:
	default:
		return fmt.Errorf("pgtable: value %q: want jsonb, bytea or auto", c.Value)
	}
	for _, t := range append([]string{c.Table, c.ProgressTable, c.RefusedTable}, mapValues(c.Tables)...) {
		if _, err := parseTable(t); err != nil {
			return fmt.Errorf("pgtable: %w", err)
		}
	}
	return nil
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// Target is a PostgreSQL sink; it implements sink.Target. Its methods are
// called from one goroutine.
type Target struct {
	cfg      Config
	pool     *pgxpool.Pool
	progress string // sanitized
	refused  string // sanitized
	cols     []string
	ready    bool // the tables are there
}

// Open makes the target; it connects on the first Resume, which creates or
// checks the tables.
func Open(ctx context.Context, cfg Config) (*Target, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("pgtable: DSN: %w", err)
	}
	pc.MaxConns = cfg.MaxConns
	pc.MinConns = 0
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgtable: connect: %w", err)
	}
	pt, _ := parseTable(cfg.ProgressTable)
	rt, _ := parseTable(cfg.RefusedTable)
	t := &Target{cfg: cfg, pool: pool, progress: pt.Sanitize(), refused: rt.Sanitize()}
	t.cols = []string{"outbox_id", "key", "value"}
	if cfg.Value == Auto {
		t.cols = append(t.cols, "value_bytes")
	}
	t.cols = append(t.cols, "headers", "feed", "partition", "epoch", "position", "topic", "created_at")
	return t, nil
}

// Close closes the target's connections.
func (t *Target) Close() error {
	t.pool.Close()
	return nil
}

func (t *Target) tables() []string {
	seen := map[string]bool{t.cfg.Table: true}
	out := []string{t.cfg.Table}
	for _, tb := range mapValues(t.cfg.Tables) {
		if !seen[tb] {
			seen[tb] = true
			out = append(out, tb)
		}
	}
	return out
}

func (t *Target) tableOf(topic string) string {
	if tb, ok := t.cfg.Tables[topic]; ok {
		return tb
	}
	return t.cfg.Table
}

// setupLock serializes the creation of tables among processes.
const setupLock = 0x6f7574626f7864 // "outboxd"

// setup creates the sink's own tables and its progress row, and creates or
// checks the output tables.
func (t *Target) setup(ctx context.Context) error {
	tx, err := t.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgtable: begin setup: %w", err)
	}
	defer tx.Rollback(ctx)
	stmts := []string{
		`SELECT pg_advisory_xact_lock(` + fmt.Sprint(setupLock) + `)`,
		`CREATE TABLE IF NOT EXISTS ` + t.progress + ` (
	sink text PRIMARY KEY,
	last_id bigint NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
)`,
		`CREATE TABLE IF NOT EXISTS ` + t.refused + ` (
	sink text NOT NULL,
	outbox_id bigint NOT NULL,
	reason text NOT NULL,
	error text NOT NULL,
	PRIMARY KEY (sink, outbox_id)
)`,
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgtable: create the sink's tables: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+t.progress+` (sink, last_id) VALUES ($1, 0) ON CONFLICT (sink) DO NOTHING`, t.cfg.Sink); err != nil {
		return fmt.Errorf("pgtable: progress row: %w", err)
	}
	for _, name := range t.tables() {
		id, _ := parseTable(name)
		if t.cfg.Create {
			if _, err := tx.Exec(ctx, t.createSQL(id.Sanitize())); err != nil {
				return fmt.Errorf("pgtable: create table %s: %w", name, err)
			}
		}
		if err := t.check(ctx, tx, name, id.Sanitize()); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgtable: commit setup: %w", err)
	}
	return nil
}

func (t *Target) valueType() string {
	if t.cfg.Value == Bytea {
		return "bytea"
	}
	return "jsonb"
}

func (t *Target) createSQL(table string) string {
	idCol, keyCol := "outbox_id bigint PRIMARY KEY", "key bytea"
	if t.cfg.Mode == Upsert {
		idCol, keyCol = "outbox_id bigint NOT NULL", "key bytea PRIMARY KEY"
	}
	cols := []string{idCol, keyCol, "value " + t.valueType()}
	if t.cfg.Value == Auto {
		cols = append(cols, "value_bytes bytea")
	}
	cols = append(cols, "headers jsonb", "feed text NOT NULL", "partition integer NOT NULL", "epoch text NOT NULL",
		"position bigint NOT NULL", "topic text NOT NULL", "created_at timestamptz NOT NULL")
	return "CREATE TABLE IF NOT EXISTS " + table + " (\n\t" + strings.Join(cols, ",\n\t") + "\n)"
}

// columnTypes are the types each column must have, by name.
func (t *Target) columnTypes() map[string]string {
	return map[string]string{
		"outbox_id": "int8", "key": "bytea", "value": map[bool]string{true: "bytea", false: "jsonb"}[t.cfg.Value == Bytea],
		"value_bytes": "bytea", "headers": "jsonb", "feed": "text", "partition": "int4", "epoch": "text",
		"position": "int8", "topic": "text", "created_at": "timestamptz",
	}
}

// check verifies that table has the columns of their types, and for an
// upsert a unique index on key alone.
func (t *Target) check(ctx context.Context, tx pgx.Tx, name, table string) error {
	rows, err := tx.Query(ctx, `SELECT a.attname, format_type(a.atttypid, NULL)::text, t.typname::text
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`, table)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" {
			return fmt.Errorf("pgtable: table %s does not exist (create it, or set create)", name)
		}
		return fmt.Errorf("pgtable: check table %s: %w", name, err)
	}
	have := map[string]string{}
	for rows.Next() {
		var col, pretty, typ string
		if err := rows.Scan(&col, &pretty, &typ); err != nil {
			return fmt.Errorf("pgtable: check table %s: %w", name, err)
		}
		have[col] = typ
	}
	if err := rows.Err(); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" {
			return fmt.Errorf("pgtable: table %s does not exist (create it, or set create)", name)
		}
		return fmt.Errorf("pgtable: check table %s: %w", name, err)
	}
	want := t.columnTypes()
	var bad []string
	for _, col := range t.cols {
		got, ok := have[col]
		switch {
		case !ok:
			bad = append(bad, col+" missing")
		case got != want[col]:
			bad = append(bad, fmt.Sprintf("%s is %s, want %s", col, got, want[col]))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("pgtable: table %s: %s", name, strings.Join(bad, "; "))
	}
	if t.cfg.Mode == Upsert {
		var ok bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (
	SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
	WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = 'key')`, table).Scan(&ok); err != nil {
			return fmt.Errorf("pgtable: check table %s: %w", name, err)
		}
		if !ok {
			return fmt.Errorf("pgtable: table %s: an upsert needs a unique index on key alone", name)
		}
	}
	return nil
}

// Resume returns the largest outbox id the sink's progress row covers, or,
// when refusals are kept that the runner may not have stored, the id
// before the oldest of them. It creates or checks the tables the first
// time it reaches the database.
func (t *Target) Resume(ctx context.Context) (int64, error) {
	if !t.ready {
		if err := t.setup(ctx); err != nil {
			return 0, err
		}
		t.ready = true
	}
	var last int64
	var oldest *int64
	err := t.pool.QueryRow(ctx, `SELECT p.last_id, (SELECT min(outbox_id) FROM `+t.refused+` WHERE sink = $1)
FROM `+t.progress+` p WHERE p.sink = $1`, t.cfg.Sink).Scan(&last, &oldest)
	if err != nil {
		return 0, fmt.Errorf("pgtable: read progress of sink %s: %w", t.cfg.Sink, err)
	}
	if oldest != nil && *oldest-1 < last {
		return *oldest - 1, nil
	}
	return last, nil
}

// Screen returns the rows this sink refuses whatever the table holds (a
// value that is not JSON for a jsonb column, an upsert without a key)
// apart from the others, so the runner stores them before it delivers.
func (t *Target) Screen(rows []outbox.Row) (keep []outbox.Row, refused []outbox.RowDeadLetter) {
	keep = rows[:0:0]
	for _, r := range rows {
		if d, bad := t.screen(r); bad {
			refused = append(refused, d)
			continue
		}
		keep = append(keep, r)
	}
	return keep, refused
}

func (t *Target) screen(r outbox.Row) (outbox.RowDeadLetter, bool) {
	if t.cfg.Mode == Upsert && len(r.Key) == 0 {
		return outbox.RowDeadLetter{Row: r, Reason: ReasonNoKey, Error: "an upsert by key needs a key: the output has none"}, true
	}
	if t.cfg.Value == JSONB && !json.Valid(r.Value) {
		return outbox.RowDeadLetter{Row: r, Reason: ReasonNotJSON, Error: fmt.Sprintf("the value (%d bytes) is not JSON and the value column is jsonb", len(r.Value))}, true
	}
	return outbox.RowDeadLetter{}, false
}

// Deliver writes rows into their tables and moves the progress row past
// them, in one transaction. Rows the progress row covers already (another
// process delivered them) are not written again.
func (t *Target) Deliver(ctx context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	if !t.ready {
		if _, err := t.Resume(ctx); err != nil {
			return nil, err
		}
	}
	tx, err := t.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgtable: begin: %w", err)
	}
	defer tx.Rollback(ctx)
	var last int64
	if err := tx.QueryRow(ctx, `SELECT last_id FROM `+t.progress+` WHERE sink = $1 FOR UPDATE`, t.cfg.Sink).Scan(&last); err != nil {
		return nil, fmt.Errorf("pgtable: lock progress of sink %s: %w", t.cfg.Sink, err)
	}
	// Refusals older than these rows are stored by the runner: it only
	// delivers rows after what it stored, dead letters first.
	if _, err := tx.Exec(ctx, `DELETE FROM `+t.refused+` WHERE sink = $1 AND outbox_id < $2`, t.cfg.Sink, rows[0].ID); err != nil {
		return nil, fmt.Errorf("pgtable: forget stored refusals: %w", err)
	}
	var dead []outbox.RowDeadLetter
	if rows[0].ID <= last {
		// Delivered before: return again the refusals among them.
		kept, err := t.keptRefusals(ctx, tx, rows[0].ID, min(last, rows[len(rows)-1].ID))
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			if r.ID > last {
				break
			}
			if d, ok := kept[r.ID]; ok {
				d.Row = r
				dead = append(dead, d)
			}
		}
		i, _ := slices.BinarySearchFunc(rows, last+1, func(r outbox.Row, id int64) int { return int(min(max(r.ID-id, -1), 1)) })
		rows = rows[i:]
	}
	if len(rows) == 0 {
		if err := tx.Commit(ctx); err != nil {
			return nil, fmt.Errorf("pgtable: commit: %w", err)
		}
		return dead, nil
	}
	var newDead []outbox.RowDeadLetter
	byTable := map[string][]outbox.Row{}
	var order []string
	for _, r := range rows {
		if d, bad := t.screen(r); bad {
			newDead = append(newDead, d)
			continue
		}
		tb := t.tableOf(r.Topic)
		if _, ok := byTable[tb]; !ok {
			order = append(order, tb)
		}
		byTable[tb] = append(byTable[tb], r)
	}
	for _, tb := range order {
		refused, err := t.write(ctx, tx, tb, byTable[tb])
		if err != nil {
			return nil, err
		}
		newDead = append(newDead, refused...)
	}
	if len(newDead) > 0 {
		slices.SortFunc(newDead, func(a, b outbox.RowDeadLetter) int { return cmpID(a.Row.ID, b.Row.ID) })
		if err := t.keepRefusals(ctx, tx, newDead); err != nil {
			return nil, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE `+t.progress+` SET last_id = $2, updated_at = now() WHERE sink = $1`, t.cfg.Sink, rows[len(rows)-1].ID); err != nil {
		return nil, fmt.Errorf("pgtable: store progress of sink %s: %w", t.cfg.Sink, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("pgtable: commit: %w", err)
	}
	return append(dead, newDead...), nil
}

func cmpID(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (t *Target) keptRefusals(ctx context.Context, tx pgx.Tx, from, to int64) (map[int64]outbox.RowDeadLetter, error) {
	rs, err := tx.Query(ctx, `SELECT outbox_id, reason, error FROM `+t.refused+` WHERE sink = $1 AND outbox_id BETWEEN $2 AND $3`, t.cfg.Sink, from, to)
	if err != nil {
		return nil, fmt.Errorf("pgtable: read kept refusals: %w", err)
	}
	defer rs.Close()
	out := map[int64]outbox.RowDeadLetter{}
	for rs.Next() {
		var id int64
		var d outbox.RowDeadLetter
		if err := rs.Scan(&id, &d.Reason, &d.Error); err != nil {
			return nil, fmt.Errorf("pgtable: read kept refusals: %w", err)
		}
		out[id] = d
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("pgtable: read kept refusals: %w", err)
	}
	return out, nil
}

func (t *Target) keepRefusals(ctx context.Context, tx pgx.Tx, dls []outbox.RowDeadLetter) error {
	ids := make([]int64, len(dls))
	reasons := make([]string, len(dls))
	errs := make([]string, len(dls))
	for i, d := range dls {
		ids[i], reasons[i], errs[i] = d.Row.ID, d.Reason, strings.ToValidUTF8(strings.ReplaceAll(d.Error, "\x00", ""), "?")
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+t.refused+` (sink, outbox_id, reason, error)
SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::text[]) ON CONFLICT DO NOTHING`, t.cfg.Sink, ids, reasons, errs)
	if err != nil {
		return fmt.Errorf("pgtable: keep refusals: %w", err)
	}
	return nil
}

// write writes rows into table: all at once (COPY for an insert, one
// INSERT ... ON CONFLICT of arrays for an upsert), or, when PostgreSQL
// refuses that for the data of some row, one by one, each in a savepoint,
// returning the rows it refuses.
func (t *Target) write(ctx context.Context, tx pgx.Tx, table string, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	id, _ := parseTable(table)
	if t.cfg.Mode == Upsert {
		rows = lastPerKey(rows)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgtable: savepoint: %w", err)
	}
	err = t.writeAll(ctx, sp, id, rows)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return nil, fmt.Errorf("pgtable: release savepoint: %w", err)
		}
		return nil, nil
	}
	if !rowFault(err) {
		return nil, fmt.Errorf("pgtable: write %d rows into %s: %w", len(rows), table, err)
	}
	if err := sp.Rollback(ctx); err != nil {
		return nil, fmt.Errorf("pgtable: roll back savepoint: %w", err)
	}
	var dead []outbox.RowDeadLetter
	for _, r := range rows {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("pgtable: savepoint: %w", err)
		}
		err = t.writeAll(ctx, sp, id, []outbox.Row{r})
		if err == nil {
			if err := sp.Commit(ctx); err != nil {
				return nil, fmt.Errorf("pgtable: release savepoint: %w", err)
			}
			continue
		}
		if !rowFault(err) {
			return nil, fmt.Errorf("pgtable: write row %d into %s: %w", r.ID, table, err)
		}
		if err := sp.Rollback(ctx); err != nil {
			return nil, fmt.Errorf("pgtable: roll back savepoint: %w", err)
		}
		dead = append(dead, outbox.RowDeadLetter{Row: r, Reason: ReasonRefused, Error: fmt.Sprintf("table %s: %v", table, err)})
	}
	return dead, nil
}

// rowFault reports whether err is PostgreSQL refusing the data of a row:
// a data exception (class 22) or an integrity constraint (class 23).
func rowFault(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23"))
}

// lastPerKey keeps the last row of each key, in id order: one statement
// of an upsert may not touch a row twice.
func lastPerKey(rows []outbox.Row) []outbox.Row {
	last := make(map[string]int, len(rows))
	for i, r := range rows {
		last[string(r.Key)] = i
	}
	if len(last) == len(rows) {
		return rows
	}
	out := make([]outbox.Row, 0, len(last))
	for i, r := range rows {
		if last[string(r.Key)] == i {
			out = append(out, r)
		}
	}
	return out
}

// values are a row's column values in t.cols order.
func (t *Target) values(r outbox.Row) ([]any, error) {
	hs, err := headersJSON(r.Headers)
	if err != nil {
		return nil, fmt.Errorf("pgtable: row %d: %w", r.ID, err)
	}
	var key any
	if r.Key != nil {
		key = r.Key
	}
	vals := make([]any, 0, len(t.cols))
	vals = append(vals, r.ID, key)
	switch t.cfg.Value {
	case JSONB:
		vals = append(vals, jsonText(r.Value))
	case Bytea:
		vals = append(vals, nonNil(r.Value))
	case Auto:
		if json.Valid(r.Value) {
			vals = append(vals, jsonText(r.Value), nil)
		} else {
			vals = append(vals, nil, nonNil(r.Value))
		}
	}
	vals = append(vals, hs, r.Feed, r.Partition, r.Epoch, r.Position, r.Topic, time.Unix(0, r.CreatedAt).UTC())
	return vals, nil
}

// jsonText is a JSON value for a jsonb parameter (its text form).
func jsonText(b []byte) any { return string(b) }

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (t *Target) writeAll(ctx context.Context, tx pgx.Tx, table pgx.Identifier, rows []outbox.Row) error {
	if t.cfg.Mode == Insert {
		src := make([][]any, len(rows))
		for i, r := range rows {
			v, err := t.values(r)
			if err != nil {
				return err
			}
			src[i] = v
		}
		_, err := tx.CopyFrom(ctx, table, t.cols, pgx.CopyFromRows(src))
		return err
	}
	cols := make([][]any, len(t.cols))
	for _, r := range rows {
		v, err := t.values(r)
		if err != nil {
			return err
		}
		for i := range v {
			cols[i] = append(cols[i], v[i])
		}
	}
	_, err := tx.Exec(ctx, t.upsertSQL(table.Sanitize()), argsOf(cols)...)
	return err
}

func argsOf(cols [][]any) []any {
	out := make([]any, len(cols))
	for i, c := range cols {
		out[i] = c
	}
	return out
}

func (t *Target) upsertSQL(table string) string {
	types := map[string]string{"outbox_id": "bigint", "key": "bytea", "value": t.valueType(), "value_bytes": "bytea",
		"headers": "jsonb", "feed": "text", "partition": "integer", "epoch": "text", "position": "bigint", "topic": "text",
		"created_at": "timestamptz"}
	params := make([]string, len(t.cols))
	sets := make([]string, 0, len(t.cols))
	for i, c := range t.cols {
		params[i] = fmt.Sprintf("$%d::%s[]", i+1, types[c])
		if c != "key" {
			sets = append(sets, c+" = EXCLUDED."+c)
		}
	}
	return "INSERT INTO " + table + " AS t (" + strings.Join(t.cols, ", ") + ")\nSELECT * FROM unnest(" + strings.Join(params, ", ") +
		")\nON CONFLICT (key) DO UPDATE SET " + strings.Join(sets, ", ") + "\nWHERE t.outbox_id < EXCLUDED.outbox_id"
}

// header is one header in the headers column: its value as a string when
// it is UTF-8 without NUL (what jsonb holds), else in base64.
type header struct {
	Key         string `json:"key"`
	Value       string `json:"value,omitempty"`
	ValueBase64 string `json:"value_base64,omitempty"`
}

// headersJSON is the headers column: a JSON array of {"key", "value"} in
// the output's order, or NULL for none.
func headersJSON(enc []byte) (any, error) {
	hs, err := outbox.DecodeHeaders(enc)
	if err != nil {
		return nil, err
	}
	if len(hs) == 0 {
		return nil, nil
	}
	out := make([]header, len(hs))
	for i, h := range hs {
		out[i].Key = strings.ReplaceAll(strings.ToValidUTF8(h.Key, "\uFFFD"), "\x00", "\uFFFD")
		if utf8.Valid(h.Value) && !slices.Contains(h.Value, 0) {
			out[i].Value = string(h.Value)
		} else {
			out[i].ValueBase64 = base64.StdEncoding.EncodeToString(h.Value)
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}
