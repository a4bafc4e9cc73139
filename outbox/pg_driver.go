package outbox

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/stdlib"
)

// pgConnector makes the store's PostgreSQL connections: pgx's own
// database/sql connections, each behind a pgConn.
type pgConnector struct{ c driver.Connector }

// Connect implements driver.Connector.
func (p pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := p.c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &pgConn{Conn: c.(*stdlib.Conn)}, nil
}

// Driver implements driver.Connector.
func (p pgConnector) Driver() driver.Driver { return p.c.Driver() }

// pgConn is a pgx connection that takes the store's SQL as written for
// SQLite: each statement's text goes through pgSQL before pgx sees it.
// Everything else (transactions, argument checks, session resets) is
// pgx's.
type pgConn struct{ *stdlib.Conn }

// Prepare implements driver.Conn.
func (c *pgConn) Prepare(query string) (driver.Stmt, error) {
	st, err := c.Conn.Prepare(pgSQL(query))
	if err != nil {
		return nil, err
	}
	return &pgStmt{st.(*stdlib.Stmt)}, nil
}

// PrepareContext implements driver.ConnPrepareContext.
func (c *pgConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.PrepareContext(ctx, pgSQL(query))
	if err != nil {
		return nil, canceledBy(ctx, err)
	}
	return &pgStmt{st.(*stdlib.Stmt)}, nil
}

// ExecContext implements driver.ExecerContext.
func (c *pgConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.Conn.ExecContext(ctx, pgSQL(query), args)
	return r, canceledBy(ctx, err)
}

// QueryContext implements driver.QueryerContext.
func (c *pgConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.QueryContext(ctx, pgSQL(query), args)
	if err != nil {
		return nil, canceledBy(ctx, err)
	}
	return &pgRows{Rows: rows, ctx: ctx}, nil
}

// pgStmt is a prepared statement of a pgConn: its errors say so when a
// context's end canceled it (canceledBy).
type pgStmt struct{ *stdlib.Stmt }

// ExecContext implements driver.StmtExecContext.
func (s *pgStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	r, err := s.Stmt.ExecContext(ctx, args)
	return r, canceledBy(ctx, err)
}

// QueryContext implements driver.StmtQueryContext.
func (s *pgStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := s.Stmt.QueryContext(ctx, args)
	if err != nil {
		return nil, canceledBy(ctx, err)
	}
	return &pgRows{Rows: rows, ctx: ctx}, nil
}

// pgRows are a query's rows, whose errors say so when the query's
// context's end canceled it.
type pgRows struct {
	driver.Rows
	ctx context.Context
}

// Next implements driver.Rows.
func (r *pgRows) Next(dest []driver.Value) error {
	return canceledBy(r.ctx, r.Rows.Next(dest))
}

// canceledBy is err wrapping ctx's error too when err is the server's
// answer to the cancel request ctx's end sent (SQLSTATE 57014): callers
// see the deadline, as they do on SQLite.
func canceledBy(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if code, ok := pgCode(err); ok && code == "57014" {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return err
}

// pgTexts caches pgSQL's answers: the store runs a few statements many
// times. A processor building statements of ever new shapes would grow it
// without end, so it stops keeping answers past pgTextsMax.
var pgTexts struct {
	sync.Mutex
	m map[string]string
}

const pgTextsMax = 4096

// pgSQL is query in PostgreSQL's dialect: its own text from pgDialect
// when the SQLite text differs there, with SQLite's placeholders bound as
// PostgreSQL's (rebindPG).
func pgSQL(query string) string {
	pgTexts.Lock()
	q, ok := pgTexts.m[query]
	pgTexts.Unlock()
	if ok {
		return q
	}
	q = query
	if d, ok := pgDialect[query]; ok {
		q = d
	}
	q = rebindPG(q)
	pgTexts.Lock()
	if pgTexts.m == nil {
		pgTexts.m = map[string]string{}
	}
	if len(pgTexts.m) < pgTextsMax {
		pgTexts.m[query] = q
	}
	pgTexts.Unlock()
	return q
}

// rebindPG turns SQLite's placeholders into PostgreSQL's: ?N becomes $N,
// and a bare ? the next number after the largest so far (SQLite's own
// rule), so "?, ?" is "$1, $2" and "?2, ?" is "$2, $3". Text in quotes
// and comments is left alone; $N already in the text stays as it is.
func rebindPG(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 8)
	top := 0
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == '\'' || c == '"':
			j := endQuoted(q, i, c)
			b.WriteString(q[i:j])
			i = j
		case c == '-' && strings.HasPrefix(q[i:], "--"):
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				j = len(q) - i
			}
			b.WriteString(q[i : i+j])
			i += j
		case c == '/' && strings.HasPrefix(q[i:], "/*"):
			j := strings.Index(q[i+2:], "*/")
			if j < 0 {
				j = len(q) - i - 2
			} else {
				j += 2
			}
			b.WriteString(q[i : i+2+j])
			i += 2 + j
		case c == '?':
			j := i + 1
			for j < len(q) && q[j] >= '0' && q[j] <= '9' {
				j++
			}
			n := top + 1
			if j > i+1 {
				n, _ = strconv.Atoi(q[i+1 : j])
			}
			top = max(top, n)
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// endQuoted is the index after the quoted text starting at q[i] with
// quote c (a doubled quote inside stays in it).
func endQuoted(q string, i int, c byte) int {
	for j := i + 1; j < len(q); j++ {
		if q[j] == c {
			if j+1 < len(q) && q[j+1] == c {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(q)
}
