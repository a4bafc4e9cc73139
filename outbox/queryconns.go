package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
)

// QueryConns is how many connections the store keeps for state queries,
// and so how many run at once. They are a pool of their own, apart from
// the read pool the relay and the status endpoints use, so queries in a
// loop never take a connection from publishing; and each connection
// keeps every query prepared, so a run binds and steps, nothing more.
// Three leave the machine's other cores to ingest: a query holds its
// connection only while SQLite steps, which is a small part of an
// answer's cost.
const QueryConns = 3

// errQueriesClosed: the store is closed, and its query connections with it.
var errQueriesClosed = errors.New("the store is closed")

// queryConns are the store's query connections, opened on first use.
type queryConns struct {
	mu     sync.Mutex // held while the pool opens, and to close it
	db     *sql.DB
	free   chan *queryConn // nil until the pool is open
	closed bool
}

// queryConn is one query connection and the statements prepared on it.
type queryConn struct {
	conn  *sql.Conn
	stmts map[*Query]preparedStmt
}

// preparedStmt is a query's statement on one connection, prepared at the
// query's generation gen (Query.Close moves it on, and the next run
// prepares again).
type preparedStmt struct {
	stmt driver.Stmt
	gen  uint64
}

// queryConn takes a free query connection, waiting for one while ctx
// lasts. The caller gives it back with putQueryConn.
func (s *Store) queryConn(ctx context.Context) (*queryConn, error) {
	if s.closed.Load() {
		return nil, errQueriesClosed
	}
	free, err := s.queryPool(ctx)
	if err != nil {
		return nil, err
	}
	select {
	case c := <-free:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *Store) putQueryConn(c *queryConn) { s.queries.free <- c }

// queryPool returns the free query connections, opening the pool the
// first time within ctx. A failure to open is not kept: the next query
// tries again, so a first query whose time limit ran out while the pool
// opened does not leave every later one failing.
func (s *Store) queryPool(ctx context.Context) (chan *queryConn, error) {
	s.queries.mu.Lock()
	defer s.queries.mu.Unlock()
	if s.queries.closed {
		return nil, errQueriesClosed
	}
	if s.queries.free == nil {
		if err := s.openQueryConns(ctx); err != nil {
			return nil, err
		}
	}
	return s.queries.free, nil
}

// openQueryConns opens the query pool: QueryConns read-only connections,
// held for the store's life. The caller holds s.queries.mu.
func (s *Store) openQueryConns(ctx context.Context) error {
	db, err := sql.Open("sqlite", s.dsn(true))
	if err != nil {
		return fmt.Errorf("open %s for queries: %w", s.cfg.Path, err)
	}
	db.SetMaxOpenConns(QueryConns)
	db.SetMaxIdleConns(QueryConns)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	free := make(chan *queryConn, QueryConns)
	for range QueryConns {
		conn, err := db.Conn(ctx)
		if err != nil {
			close(free)
			for c := range free {
				c.conn.Close()
			}
			db.Close()
			return fmt.Errorf("open a query connection to %s: %w", s.cfg.Path, err)
		}
		free <- &queryConn{conn: conn, stmts: map[*Query]preparedStmt{}}
	}
	s.queries.db, s.queries.free = db, free
	return nil
}

// closeQueryConns closes the query pool, waiting for the runs under way
// to give their connections back.
func (s *Store) closeQueryConns() error {
	s.queries.mu.Lock()
	s.queries.closed = true
	db, free := s.queries.db, s.queries.free
	s.queries.mu.Unlock()
	if free == nil {
		return nil
	}
	var errs []error
	for range QueryConns {
		c := <-free
		errs = append(errs, c.conn.Raw(func(any) error {
			for _, p := range c.stmts {
				p.stmt.Close()
			}
			return nil
		}), c.conn.Close())
	}
	errs = append(errs, db.Close())
	return errors.Join(errs...)
}

// renewQueryConn replaces c's connection, which the driver found broken
// (database/sql closed it), with a new one, so the pool keeps its
// QueryConns. When none opens, c stays broken and the next run on it
// tries again.
func (s *Store) renewQueryConn(ctx context.Context, c *queryConn) error {
	conn, err := s.queries.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("open a query connection to %s: %w", s.cfg.Path, err)
	}
	c.conn.Close()
	c.conn, c.stmts = conn, map[*Query]preparedStmt{}
	return nil
}

// statement is q's statement on this connection, prepared on dc (the
// connection's driver side) when it has none at q's generation.
func (c *queryConn) statement(ctx context.Context, dc any, q *Query, gen uint64) (driver.Stmt, error) {
	if p, ok := c.stmts[q]; ok {
		if p.gen == gen {
			return p.stmt, nil
		}
		p.stmt.Close()
		delete(c.stmts, q)
	}
	pc, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, errors.New("the SQLite driver cannot prepare with a context")
	}
	st, err := pc.PrepareContext(ctx, q.text)
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	c.stmts[q] = preparedStmt{stmt: st, gen: gen}
	return st, nil
}
