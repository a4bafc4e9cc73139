package outbox

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/internal/sqllex"
)

// State queries on PostgreSQL. The text is checked as on SQLite
// (scanQuery: one statement, a SELECT, VALUES or WITH ... SELECT, named
// parameters), then PostgreSQL is the guard: each run is a READ ONLY
// transaction (a write, a data-modifying WITH, nextval: refused, SQLSTATE
// 25006) with SET LOCAL statement_timeout at the run's limit, on a
// connection of the read pool, whose sessions are read-only by default
// too. SQLite's authorizer has no counterpart and needs none: what a READ
// ONLY transaction lets through only reads. The columns are those of the
// statement prepared on the server, which also says a table or column
// is missing (42P01, 42703: ErrQueryNotReady) before any run.

// pgQueryText is text with each named parameter written $N, N its place
// in params.
func pgQueryText(text string, params []string) string {
	var b strings.Builder
	for i := 0; i < len(text); {
		t, err := sqllex.Next(text[i:])
		if err != nil { // scanQuery read it whole before
			b.WriteString(text[i:])
			break
		}
		i += len(t.Text)
		if t.Kind == sqllex.Variable {
			b.WriteString("$" + strconv.Itoa(slices.Index(params, t.Text[1:])+1))
			continue
		}
		b.WriteString(t.Text)
	}
	return b.String()
}

// pgRaw runs f with the pgx connection of a read pool connection.
func (s *Store) pgRaw(ctx context.Context, f func(c *pgx.Conn) error) error {
	conn, err := s.rdb.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc, ok := dc.(*pgConn)
		if !ok {
			return fmt.Errorf("a read connection is a %T, not PostgreSQL's", dc)
		}
		return f(pc.Conn.Conn())
	})
}

// pgQueryColumns prepares text on the server, in a read-only
// transaction, and returns its result columns.
func (s *Store) pgQueryColumns(ctx context.Context, text string) ([]string, error) {
	var cols []string
	err := s.pgRaw(ctx, func(c *pgx.Conn) error {
		tx, err := c.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		sd, err := tx.Prepare(ctx, pgCheckStmt, text)
		if err != nil {
			return err
		}
		defer c.Deallocate(context.Background(), pgCheckStmt)
		for _, f := range sd.Fields {
			cols = append(cols, f.Name)
		}
		return pgRefuseWrites(ctx, tx, len(sd.ParamOIDs))
	})
	if code, ok := pgCode(err); ok && (code == "42P01" || code == "42703" || code == "42883") {
		return nil, fmt.Errorf("%w: %v", ErrQueryNotReady, err)
	}
	return cols, err
}

// pgCheckStmt names the statement a query's check prepares, on a session
// of its own for the check's length.
const pgCheckStmt = "outboxd_query_check"

// pgRefuseWrites refuses, with ErrQueryRefused, a prepared query whose
// plan modifies a table (a data-modifying WITH): a READ ONLY transaction
// would refuse it at each run, but a start should instead. The plan is
// EXPLAIN's, made with every parameter NULL, nothing run.
func pgRefuseWrites(ctx context.Context, tx pgx.Tx, params int) error {
	q := "EXPLAIN (FORMAT JSON) EXECUTE " + pgCheckStmt
	if params > 0 {
		q += "(" + strings.TrimSuffix(strings.Repeat("NULL, ", params), ", ") + ")"
	}
	var plan string
	if err := tx.QueryRow(ctx, q).Scan(&plan); err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	if strings.Contains(plan, `"ModifyTable"`) {
		return fmt.Errorf("%w: it writes (a data-modifying WITH): a query may only read", ErrQueryRefused)
	}
	return nil
}

// pgQuery is Query on PostgreSQL.
func (s *Store) pgQuery(ctx context.Context, q *Query, args []driver.NamedValue, lim QueryLimits) (QueryResult, error) {
	q.mu.Lock()
	cols, names := q.columns, q.names
	q.mu.Unlock()
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	rctx, cancel := context.WithTimeout(ctx, lim.Timeout+time.Second) // the server's own timeout comes first
	defer cancel()
	res := QueryResult{Columns: cols, Rows: []json.RawMessage{}}
	err := s.pgRaw(rctx, func(c *pgx.Conn) error {
		tx, err := c.BeginTx(rctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		ms := max(lim.Timeout.Milliseconds(), 1)
		if _, err := tx.Exec(rctx, "SET LOCAL statement_timeout = "+strconv.FormatInt(ms, 10)); err != nil {
			return err
		}
		rows, err := tx.Query(rctx, q.pgText, vals...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return pgReadRows(rows, names, lim, &res)
	})
	if code, ok := pgCode(err); ok && code == "57014" || err != nil && ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return QueryResult{}, fmt.Errorf("query %s: %w (%v)", q.name, ErrQueryTimeout, lim.Timeout)
	}
	if code, ok := pgCode(err); ok && code == "25006" {
		return QueryResult{}, fmt.Errorf("query %s: %w: %v", q.name, ErrQueryRefused, err)
	}
	if err != nil {
		return QueryResult{}, fmt.Errorf("query %s: %w", q.name, err)
	}
	return res, nil
}

// pgReadRows adds rows to res within lim, each value as SQLite's answer
// would give it where the types meet (integers, reals, text, blobs,
// NULL), and booleans as JSON's, times as RFC 3339 text, numerics as
// numbers.
func pgReadRows(rows pgx.Rows, names [][]byte, lim QueryLimits, res *QueryResult) error {
	fds := rows.FieldDescriptions()
	if len(fds) != len(names) {
		rows.Close()
		if err := rows.Err(); err != nil {
			return err // the statement failed before its first row
		}
		return fmt.Errorf("the query's columns changed: %d, prepared with %d", len(fds), len(names))
	}
	dv := make([]driver.Value, len(fds))
	var buf []byte
	for rows.Next() {
		vs, err := rows.Values()
		if err != nil {
			return err
		}
		if len(res.Rows) == lim.MaxRows {
			res.Truncated = "rows"
			return nil
		}
		for i, v := range vs {
			dv[i] = pgJSONValue(v)
		}
		if buf, err = appendRow(buf[:0], names, dv); err != nil {
			return err
		}
		if res.Bytes+len(buf) > lim.MaxBytes {
			res.Truncated = "bytes"
			return nil
		}
		res.Rows = append(res.Rows, json.RawMessage(slices.Clone(buf)))
		res.Bytes += len(buf)
	}
	return rows.Err()
}

// pgJSONValue is v, as pgx decodes it, in the form appendValue encodes.
func pgJSONValue(v any) driver.Value {
	switch x := v.(type) {
	case nil, int64, float64, string, []byte, bool:
		return x
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case pgtype.Numeric:
		if f, err := x.Float64Value(); err == nil && f.Valid {
			if i, err := x.Int64Value(); err == nil && i.Valid && x.Exp >= 0 {
				return i.Int64
			}
			return f.Float64
		}
		return nil
	}
	return v // json.Marshal's encoding
}
