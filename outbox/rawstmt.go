package outbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"time"
)

// Statement is a statement a processor declares once, by its SQL text,
// and runs in Tx.Batch as often as it needs: the store prepares it on its
// engine's fastest path the first time and keeps it prepared. Arguments
// bind by position (?1, ?2, ...).
type Statement struct {
	query string
	pg    string // the PostgreSQL text, when it differs (OnPostgres)
}

// NewStatement declares query as a statement run through Tx.Batch.
func NewStatement(query string) *Statement { return &Statement{query: query} }

// OnPostgres gives the statement its PostgreSQL text, run in place of
// the SQLite one on a PostgreSQL store, and returns st. Placeholders are
// written as for SQLite (?, ?N). Declare it before the statement's first
// use.
func (st *Statement) OnPostgres(query string) *Statement {
	st.pg = query
	return st
}

// String is the statement's SQL text.
func (st *Statement) String() string { return st.query }

// Batch runs declared statements in the Tx.Batch call that gave it. It
// is valid only during that call.
type Batch struct {
	tx   *Tx
	dc   any // the engine's connection, during the Batch call
	args []driver.NamedValue
	rows Rows // reused by Query while no other Rows of the call is open
}

// Batch runs f in the current item's savepoint (opened now if it is not)
// with b, which runs declared statements on the engine's own connection,
// prepared once and kept by the store: for a processor whose per-item cost
// would otherwise be mostly database/sql's. Arguments are given as they
// bind, without conversion: int64, float64, bool, string, []byte,
// time.Time or nil. f must not begin, end or commit a transaction, nor
// keep b or its rows past its return. The error f returns is handled as a
// statement's (see Exec): it wraps ErrTxLost when SQLite rolled the
// transaction back.
func (tx *Tx) Batch(f func(b *Batch) error) error {
	if tx.store.pg {
		if err := tx.ensureSavepoint(); err != nil {
			return err
		}
	} else if tx.lost != nil {
		return tx.lost
	}
	if (tx.done && !tx.committing) || tx.conn == nil {
		return fmt.Errorf("batch: the transaction has ended")
	}
	var panicked any
	err := tx.conn.Raw(func(dc any) (err error) {
		defer tx.store.closeSpilled()
		if tx.inItem && !tx.savepoint {
			// On the connection in hand: through database/sql, the
			// savepoint's statement would cost as much as the item's own.
			if err := tx.controlOn(dc, sqlSavepoint); err != nil {
				return fmt.Errorf("savepoint: %w", tx.store.noteStatement(err))
			}
			tx.savepoint = true
		}
		b := &tx.batch
		b.tx, b.dc = tx, dc
		defer b.end()
		// database/sql closes a connection whose Raw function panicked,
		// under the open transaction, and the pool's next connection would
		// have no authorizer: the panic is carried past Raw instead.
		defer func() {
			if p := recover(); p != nil {
				panicked, err = p, errRawPanic
			}
		}()
		return f(b)
	})
	if panicked != nil {
		panic(panicked)
	}
	return tx.statementDone(err)
}

// controlOn runs one of the savepoint's statements on the driver
// connection dc, bound to no context (see Tx).
func (tx *Tx) controlOn(dc any, query string) error {
	st, err := tx.store.ownDriverStmt(dc, query)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(txCtx(), nil)
	return err
}

// end closes the rows left open, ends the deadline's watch of the
// connection and forgets it.
func (b *Batch) end() {
	if b.rows.r != nil {
		b.rows.Close()
	}
	if !b.tx.store.pg {
		b.tx.store.watch.end(b.dc)
	}
	b.dc = nil
	clear(b.args)
}

// bind gives args as the driver's numbered arguments, in a buffer the
// Batch reuses.
func (b *Batch) bind(args []any) []driver.NamedValue {
	b.args = b.args[:0]
	for i, a := range args {
		b.args = append(b.args, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	return b.args
}

// Exec runs st with args. Its error is the engine's own, unwrapped, so
// that the caller can classify it (see Classify).
func (b *Batch) Exec(ctx context.Context, st *Statement, args ...any) error {
	ds, err := b.stmt(st)
	if err != nil {
		return err
	}
	ex, ok := ds.(driver.StmtExecContext)
	if !ok {
		return fmt.Errorf("exec %q: the SQLite driver cannot execute with a context", firstLine(st.query))
	}
	dctx, err := b.bound(ctx)
	if err != nil {
		return err
	}
	_, err = ex.ExecContext(dctx, b.bind(args))
	return b.failed(ctx, err)
}

// bound is the context to run a statement of ctx with on the driver: on
// SQLite, the store's deadline watch binds it to ctx (see deadlineWatch).
func (b *Batch) bound(ctx context.Context) (context.Context, error) {
	if b.tx.store.pg {
		return ctx, nil
	}
	return b.tx.store.watch.bind(ctx, b.dc)
}

// failed is the error of a statement of ctx that failed with err.
func (b *Batch) failed(ctx context.Context, err error) error {
	if err == nil || b.tx.store.pg {
		return err
	}
	return b.tx.store.watch.failed(ctx, err)
}

// Query runs st with args; its rows are read with Next and closed by the
// caller before the Batch call returns. Its error is as Exec's.
func (b *Batch) Query(ctx context.Context, st *Statement, args ...any) (*Rows, error) {
	ds, err := b.stmt(st)
	if err != nil {
		return nil, err
	}
	q, ok := ds.(driver.StmtQueryContext)
	if !ok {
		return nil, fmt.Errorf("query %q: the SQLite driver cannot query with a context", firstLine(st.query))
	}
	dctx, err := b.bound(ctx)
	if err != nil {
		return nil, err
	}
	dr, err := q.QueryContext(dctx, b.bind(args))
	if err != nil {
		return nil, b.failed(ctx, err)
	}
	r := &b.rows
	if r.r != nil {
		r = &Rows{}
	}
	r.r, r.ctx, r.b = dr, ctx, b
	return r, nil
}

func (b *Batch) stmt(st *Statement) (driver.Stmt, error) {
	if b.dc == nil {
		return nil, fmt.Errorf("statement %q: the batch has ended", firstLine(st.query))
	}
	q := st.query
	if b.tx.store.pg && st.pg != "" {
		q = st.pg
	}
	return b.tx.store.driverStmt(b.dc, q)
}

// Rows are the rows of a Batch's Query.
type Rows struct {
	r    driver.Rows
	ctx  context.Context // the query's
	b    *Batch
	dest []driver.Value
	vals []any
}

// Columns are the rows' column names.
func (r *Rows) Columns() []string { return r.r.Columns() }

// Next reads the next row: false at the end (with a nil error) or on an
// error.
func (r *Rows) Next() (bool, error) {
	n := len(r.r.Columns())
	if cap(r.dest) < n {
		r.dest, r.vals = make([]driver.Value, n), make([]any, n)
	}
	r.dest, r.vals = r.dest[:n], r.vals[:n]
	switch err := r.r.Next(r.dest); {
	case err == io.EOF:
		return false, nil
	case err != nil:
		return false, r.b.failed(r.ctx, err)
	}
	for i, v := range r.dest {
		r.vals[i] = v
	}
	return true, nil
}

// Values is the row Next read, as the engine gave it (int64, float64,
// string, []byte or nil), valid until the next call of Next or Close.
func (r *Rows) Values() []any { return r.vals }

// Close closes the rows.
func (r *Rows) Close() error {
	if r.r == nil {
		return nil
	}
	err := r.r.Close()
	r.r, r.ctx, r.b = nil, nil, nil
	clear(r.dest)
	clear(r.vals)
	return err
}

// errRawPanic stands for a panic of Batch's function inside database/sql.
var errRawPanic = errors.New("raw: the function panicked")

// driverStmts are the statements Batch prepared on the writer's driver
// connection. They are used only by the holder of that connection (the
// one open Tx, or Close), so they need no lock of their own.
type driverStmts struct {
	conn  any // the driver connection they belong to
	stmts map[string]driver.Stmt
	own   map[string]driver.Stmt // the store's own (see ownDriverStmt)
}

// onConn makes dc the connection of the statements: when the pool
// replaced the connection (it does only when the driver reported the old
// one broken), its statements went with it.
func (ds *driverStmts) onConn(dc any) {
	if ds.conn != dc {
		ds.conn, ds.stmts, ds.own = dc, map[string]driver.Stmt{}, map[string]driver.Stmt{}
	}
}

// driverStmt returns query prepared on dc, kept for later calls while the
// cache has room (maxKeptStmts); past it, the statement is prepared anew
// on each call and closed when the Batch call ends.
func (s *Store) driverStmt(dc any, query string) (driver.Stmt, error) {
	ds := &s.drv
	ds.onConn(dc)
	if st, ok := ds.stmts[query]; ok {
		return st, nil
	}
	st, err := prepareDriver(dc, query)
	if err != nil {
		return nil, err
	}
	if len(ds.stmts) >= maxKeptStmts {
		s.drvSpill = append(s.drvSpill, st)
		return st, nil
	}
	ds.stmts[query] = st
	return st, nil
}

// ownDriverStmt returns one of the store's own statements (a few fixed
// texts, such as the outbox inserts) prepared on dc and kept until the
// store closes, apart from the processors' statements, so that these never
// push them out.
func (s *Store) ownDriverStmt(dc any, query string) (driver.StmtExecContext, error) {
	st, err := s.ownStmt(dc, query)
	if err != nil {
		return nil, err
	}
	ex, ok := st.(driver.StmtExecContext)
	if !ok {
		return nil, fmt.Errorf("prepare %q: the SQLite driver cannot execute with a context", firstLine(query))
	}
	return ex, nil
}

// ownQueryStmt is ownDriverStmt for a statement that returns rows.
func (s *Store) ownQueryStmt(dc any, query string) (driver.StmtQueryContext, error) {
	st, err := s.ownStmt(dc, query)
	if err != nil {
		return nil, err
	}
	q, ok := st.(driver.StmtQueryContext)
	if !ok {
		return nil, fmt.Errorf("prepare %q: the SQLite driver cannot query with a context", firstLine(query))
	}
	return q, nil
}

func (s *Store) ownStmt(dc any, query string) (driver.Stmt, error) {
	ds := &s.drv
	ds.onConn(dc)
	if st, ok := ds.own[query]; ok {
		return st, nil
	}
	st, err := prepareDriver(dc, query)
	if err != nil {
		return nil, err
	}
	ds.own[query] = st
	return st, nil
}

// prepareDriver prepares query on the driver connection dc.
func prepareDriver(dc any, query string) (driver.Stmt, error) {
	pc, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, fmt.Errorf("prepare %q: the SQLite driver cannot prepare with a context", firstLine(query))
	}
	st, err := pc.PrepareContext(context.Background(), query)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", firstLine(query), err)
	}
	return st, nil
}

// closeSpilled closes the statements prepared past the cache's room.
func (s *Store) closeSpilled() {
	for _, st := range s.drvSpill {
		st.Close()
	}
	clear(s.drvSpill)
	s.drvSpill = s.drvSpill[:0]
}

// closeDriverStmts closes the statements Batch prepared, on the writer
// connection: SQLite keeps a connection with statements left open alive
// (and its files open) after it is closed.
func (s *Store) closeDriverStmts(ctx context.Context) {
	if len(s.drv.stmts) == 0 && len(s.drv.own) == 0 {
		return
	}
	// A transaction left open would hold the connection for ever: past
	// the wait, the statements are left to the process's end.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = s.rawWriter(ctx, func(dc any) error {
		if dc == s.drv.conn {
			for _, st := range s.drv.stmts {
				st.Close()
			}
			for _, st := range s.drv.own {
				st.(driver.Stmt).Close()
			}
		}
		return nil
	})
	s.drv = driverStmts{}
}
