package outbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// Prepare returns query prepared on the writer's driver connection. The
// statement is the store's (it is closed when the store closes): its user
// must not close it, nor keep it past the Raw call that gave it.
type Prepare func(query string) (driver.Stmt, error)

// Raw runs f in the current item's savepoint (opened now if it is not)
// with prep, which gives statements prepared on the driver's own
// connection (modernc.org/sqlite), kept by the store: for a processor
// whose per-item cost is mostly database/sql's. Statements run with the
// driver's interfaces (driver.StmtExecContext, driver.StmtQueryContext)
// take driver values and NamedValue ordinals from 1. f must not begin,
// end or commit a transaction, nor keep a statement or its rows past its
// return. The error f returns is handled as a statement's (see Exec): it
// wraps ErrTxLost when SQLite rolled the transaction back.
func (tx *Tx) Raw(f func(prep Prepare) error) error {
	if err := tx.ensureSavepoint(); err != nil {
		return err
	}
	if (tx.done && !tx.committing) || tx.conn == nil {
		return fmt.Errorf("raw: the transaction has ended")
	}
	var panicked any
	err := tx.conn.Raw(func(dc any) (err error) {
		defer tx.store.closeSpilled()
		// database/sql closes a connection whose Raw function panicked,
		// under the open transaction, and the pool's next connection would
		// have no authorizer: the panic is carried past Raw instead.
		defer func() {
			if p := recover(); p != nil {
				panicked, err = p, errRawPanic
			}
		}()
		return f(func(query string) (driver.Stmt, error) { return tx.store.driverStmt(dc, query) })
	})
	if panicked != nil {
		panic(panicked)
	}
	return tx.statementDone(err)
}

// errRawPanic stands for a panic of Raw's function inside database/sql.
var errRawPanic = errors.New("raw: the function panicked")

// driverStmts are the statements Raw prepared on the writer's driver
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
// on each call and closed when the Raw call ends.
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

// closeDriverStmts closes the statements Raw prepared, on the writer
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
