package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
)

// QueryLimits bound one run of a Query.
type QueryLimits struct {
	// Timeout is how long the statement may run: past it SQLite interrupts
	// it and Query returns ErrQueryTimeout.
	Timeout time.Duration
	// MaxRows is the most rows an answer holds; MaxBytes the most bytes
	// its rows take, encoded as JSON. An answer cut at either says so
	// (QueryResult.Truncated).
	MaxRows, MaxBytes int
}

// DefaultQueryLimits are 1 second, 1,000 rows and 1 MiB.
func DefaultQueryLimits() QueryLimits {
	return QueryLimits{Timeout: time.Second, MaxRows: 1000, MaxBytes: 1 << 20}
}

// Validate reports a limit that is not positive.
func (l QueryLimits) Validate() error {
	if l.Timeout <= 0 || l.MaxRows < 1 || l.MaxBytes < 1 {
		return fmt.Errorf("query limits %v, %d rows, %d bytes: want each above 0", l.Timeout, l.MaxRows, l.MaxBytes)
	}
	return nil
}

// Errors of queries.
var (
	// ErrQueryNotReady: the query names a table (or a column) the
	// database does not hold yet, such as one a processor creates when its
	// feed starts. The query is checked again on each run until it
	// compiles.
	ErrQueryNotReady = errors.New("not ready: the database does not hold what it reads yet")
	// ErrQueryTimeout: the statement ran past QueryLimits.Timeout and was
	// interrupted.
	ErrQueryTimeout = errors.New("ran past its time limit")
	// ErrQueryRefused: the statement is not a single read-only SELECT.
	ErrQueryRefused = errors.New("refused")
)

// ParamError is a run of a query with parameters it does not take
// (Unknown) or without some it needs (Missing), or with one given more
// than once (Repeated). Each list is sorted.
type ParamError struct {
	Query                      string
	Unknown, Missing, Repeated []string
}

func (e *ParamError) Error() string {
	var parts []string
	for _, p := range []struct {
		what  string
		names []string
	}{{"unknown", e.Unknown}, {"missing", e.Missing}, {"given more than once", e.Repeated}} {
		if len(p.names) > 0 {
			parts = append(parts, p.what+" parameter "+strings.Join(p.names, ", "))
		}
	}
	return fmt.Sprintf("query %s: %s", e.Query, strings.Join(parts, "; "))
}

// Query is a named read-only statement, checked by PrepareQuery. It is
// safe for concurrent use.
type Query struct {
	name, text string
	params     []string
	pgText     string // text with its parameters as $N, on PostgreSQL (pg_query.go)

	mu      sync.Mutex
	columns []string // set once the statement compiled on this database
	names   [][]byte // the columns' names encoded, see encodedNames
	gen     uint64   // moved on by Close: a query connection prepares again
}

// Name is the query's name.
func (q *Query) Name() string { return q.name }

// Params are the names of the query's parameters (":account" is
// "account"), in the order they first appear.
func (q *Query) Params() []string { return append([]string{}, q.params...) }

// PrepareQuery checks that text is one read-only statement (a SELECT,
// VALUES or WITH ... SELECT, which only reads: SQLite's authorizer
// refuses anything else while compiling it on a read connection, and
// the first leave SQLite asks must be to select, which a write never
// asks first, even when its table does not exist yet), that
// its parameters are named (:name, @name or $name; not ?), and that its
// result columns have distinct names. An error wraps ErrQueryRefused, or
// is SQLite's own (a syntax error). When the statement names a table or
// column the database does not hold yet, PrepareQuery returns the query
// and an error wrapping ErrQueryNotReady: each Run checks it again until
// it compiles.
func (s *Store) PrepareQuery(ctx context.Context, name, text string) (*Query, error) {
	params, err := scanQuery(text)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w: %v", name, ErrQueryRefused, err)
	}
	q := &Query{name: name, text: text, params: params}
	if s.pg {
		q.pgText = pgQueryText(text, params)
	}
	if err := s.compileQuery(ctx, q); err != nil {
		if errors.Is(err, ErrQueryNotReady) {
			return q, err
		}
		return nil, err
	}
	return q, nil
}

// compileQuery checks q on a read connection under the read-only rule,
// once; each query connection prepares it on its first run.
func (s *Store) compileQuery(ctx context.Context, q *Query) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.columns != nil {
		return nil
	}
	var cols []string
	var err error
	if s.pg {
		cols, err = s.pgQueryColumns(ctx, q.pgText)
	} else {
		cols, err = s.readOnlyColumns(ctx, q.text)
	}
	if err != nil {
		return fmt.Errorf("query %s: %w", q.name, err)
	}
	if dup := duplicate(cols); dup != "" {
		return fmt.Errorf("query %s: %w: two result columns are named %q (name each with AS)", q.name, ErrQueryRefused, dup)
	}
	q.columns, q.names = cols, encodedNames(cols)
	return nil
}

// readOnlyColumns compiles text on a read connection with an authorizer
// that lets it only read, and returns its result columns.
func (s *Store) readOnlyColumns(ctx context.Context, text string) ([]string, error) {
	conn, err := s.rdb.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("read connection: %w", err)
	}
	defer conn.Close()
	var denied string
	var cols []string
	// asked is the first operation SQLite asked leave for: a SELECT (or
	// VALUES) asks leave to select before it looks up any table, while an
	// INSERT, UPDATE or DELETE looks its table up first, and when that is
	// not there asks nothing at all.
	var asked sqlite.AuthorizerActionCode
	seen := false
	err = conn.Raw(func(dc any) error {
		r, ok := dc.(sqlite.AuthorizerRegisterer)
		ci, ok2 := dc.(interface {
			ColumnInfo(string) ([]sqlite.ColumnInfo, error)
		})
		if !ok || !ok2 {
			return errors.New("the SQLite driver has no authorizer")
		}
		if err := r.RegisterAuthorizer(func(a sqlite.AuthorizerActionCode, arg1, arg2, _, _ string) sqlite.AuthorizerReturnCode {
			if !seen {
				asked, seen = a, true
			}
			if why := notReadOnly(a, arg1, arg2); why != "" {
				denied = why
				return sqlite.AuthorizerDeny
			}
			return sqlite.AuthorizerOK
		}); err != nil {
			return fmt.Errorf("install the read-only rule: %w", err)
		}
		info, err := ci.ColumnInfo(text)
		for _, c := range info {
			cols = append(cols, c.Name)
		}
		if rerr := r.RegisterAuthorizer(nil); rerr != nil {
			// A connection left under the read-only rule would refuse the
			// store's own pragmas: the pool drops it.
			return driver.ErrBadConn
		}
		return err
	})
	switch {
	case denied != "":
		return nil, fmt.Errorf("%w: %s: a query may only read", ErrQueryRefused, denied)
	case (!seen || asked != sqlite.AuthSelect) && (err == nil || !syntaxError(err)):
		// What it does is not a SELECT, whether the tables it names
		// exist or not. (A statement SQLite cannot parse asks nothing
		// either: its own error says why.)
		why := "it compiles"
		if err != nil {
			why = sqliteText(err)
		}
		return nil, fmt.Errorf("%w: SQLite does not compile it as a SELECT (%s): a query may only read", ErrQueryRefused, why)
	case err != nil && missingObject(err):
		return nil, fmt.Errorf("%w (%v)", ErrQueryNotReady, sqliteText(err))
	case err != nil:
		return nil, errors.New(sqliteText(err))
	case len(cols) == 0:
		return nil, fmt.Errorf("%w: it returns no columns", ErrQueryRefused)
	}
	return cols, nil
}

// describePragmas are the pragmas a query may read as table-valued
// functions (pragma_table_info(...)): they only describe the schema.
var describePragmas = map[string]bool{
	"table_info": true, "table_xinfo": true, "table_list": true, "index_info": true, "index_xinfo": true,
	"index_list": true, "foreign_key_list": true, "collation_list": true, "function_list": true,
	"module_list": true, "pragma_list": true, "database_list": true, "compile_options": true,
}

// notReadOnly says why an operation SQLite asks leave for is more than a
// read, "" for a read.
func notReadOnly(a sqlite.AuthorizerActionCode, arg1, arg2 string) string {
	switch a {
	case sqlite.AuthSelect, sqlite.AuthRead, sqlite.AuthRecursive:
		return ""
	case sqlite.AuthFunction:
		if strings.EqualFold(arg2, "load_extension") {
			return "load_extension"
		}
		return ""
	case sqlite.AuthPragma:
		if describePragmas[strings.ToLower(arg1)] {
			return ""
		}
		return "PRAGMA " + arg1
	case sqlite.AuthInsert, sqlite.AuthUpdate, sqlite.AuthDelete:
		return "writes " + arg1
	}
	return fmt.Sprintf("operation %d on %s", a, arg1)
}

// missingObject reports whether err is SQLite saying a table or column is
// not there.
func missingObject(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column")
}

// syntaxError reports whether err is SQLite failing to parse a
// statement, before it compiles any of it.
func syntaxError(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "syntax error") || strings.Contains(msg, "incomplete input") ||
		strings.Contains(msg, "unrecognized token")
}

// sqliteText is err's message without the driver's prefix and code.
func sqliteText(err error) string {
	msg := err.Error()
	var se *sqlite.Error
	if errors.As(err, &se) {
		msg = strings.TrimPrefix(se.Error(), "SQL logic error: ")
		msg = strings.TrimSuffix(msg, fmt.Sprintf(" (%d)", se.Code()))
	}
	return msg
}

func duplicate(names []string) string {
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if seen[n] {
			return n
		}
		seen[n] = true
	}
	return ""
}

// QueryResult is one run's answer.
type QueryResult struct {
	// Columns are the statement's result columns, in order.
	Columns []string
	// Rows are the rows read, each a JSON object of its columns in order:
	// integers and reals as numbers (an infinite real as the string
	// "Infinity" or "-Infinity"), text as strings, blobs as base64
	// strings, NULL as null.
	Rows []json.RawMessage
	// Bytes is the size of Rows' encodings together.
	Bytes int
	// Truncated is "" for the whole answer, or the limit that cut it:
	// "rows" (more rows followed) or "bytes" (the next row would have
	// passed MaxBytes).
	Truncated string
}

// Query runs q with params (each parameter's value as text: SQLite's
// affinity rules compare it with an INTEGER column as a number) on the
// read pool, one statement and so one read transaction: every row comes
// from the same commit, and ingest is never waited for. Errors: a
// *ParamError for parameters unknown, missing or repeated; one wrapping
// ErrQueryNotReady while what q reads does not exist; ErrQueryTimeout
// past lim.Timeout; ctx's error when ctx ends first. It is safe for
// concurrent use.
func (s *Store) Query(ctx context.Context, q *Query, params map[string][]string, lim QueryLimits) (QueryResult, error) {
	args, err := q.bind(params)
	if err != nil {
		return QueryResult{}, err
	}
	if err := s.compileQuery(ctx, q); err != nil {
		return QueryResult{}, err
	}
	if s.pg {
		return s.pgQuery(ctx, q, args, lim)
	}
	rctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	res, err := q.run(rctx, s, args, lim)
	if cc := (*columnsChanged)(nil); errors.As(err, &cc) {
		// A table it reads was altered (SELECT * gains a column), and
		// SQLite prepared the statement again: answer with what it
		// returns now.
		if err := q.adopt(cc.columns); err != nil {
			return QueryResult{}, err
		}
		res, err = q.run(rctx, s, args, lim)
	}
	if err != nil && ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return QueryResult{}, fmt.Errorf("query %s: %w (%v)", q.name, ErrQueryTimeout, lim.Timeout)
	}
	if err != nil {
		return QueryResult{}, fmt.Errorf("query %s: %w", q.name, err)
	}
	return res, nil
}

// bind checks params against q's parameters and returns them as named
// arguments.
func (q *Query) bind(params map[string][]string) ([]driver.NamedValue, error) {
	args := make([]driver.NamedValue, 0, len(q.params))
	for _, name := range q.params {
		if vs := params[name]; len(vs) == 1 {
			args = append(args, driver.NamedValue{Name: name, Ordinal: len(args) + 1, Value: vs[0]})
		}
	}
	if len(args) == len(q.params) && len(params) == len(q.params) {
		return args, nil
	}
	return nil, q.paramError(params)
}

// paramError says how params do not fit q's parameters.
func (q *Query) paramError(params map[string][]string) error {
	pe := &ParamError{Query: q.name}
	for name, vs := range params {
		switch {
		case !slices.Contains(q.params, name):
			pe.Unknown = append(pe.Unknown, name)
		case len(vs) > 1:
			pe.Repeated = append(pe.Repeated, name)
		}
	}
	for _, name := range q.params {
		if len(params[name]) == 0 {
			pe.Missing = append(pe.Missing, name)
		}
	}
	slices.Sort(pe.Unknown)
	slices.Sort(pe.Missing)
	slices.Sort(pe.Repeated)
	return pe
}

// run reads the rows within lim on a query connection, through the
// driver: the statement stays prepared on that connection from one run
// to the next, and each value is encoded as it is read.
func (q *Query) run(ctx context.Context, s *Store, args []driver.NamedValue, lim QueryLimits) (QueryResult, error) {
	q.mu.Lock()
	cols, names, gen := q.columns, q.names, q.gen
	q.mu.Unlock()
	c, err := s.queryConn(ctx)
	if err != nil {
		return QueryResult{}, err
	}
	defer s.putQueryConn(c)
	read := func() (QueryResult, error) {
		res := QueryResult{Columns: cols, Rows: []json.RawMessage{}}
		err := c.conn.Raw(func(dc any) error {
			st, err := c.statement(ctx, dc, q, gen)
			if err != nil {
				return err
			}
			stop, err := interruptOnEnd(ctx, dc)
			if err != nil {
				return err
			}
			defer stop()
			return readRows(ctx, st, args, names, lim, &res)
		})
		return res, err
	}
	res, err := read()
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		// The connection broke before the statement ran: run it again on
		// a new one.
		if rerr := s.renewQueryConn(ctx, c); rerr != nil {
			return QueryResult{}, fmt.Errorf("%w; %w", err, rerr)
		}
		res, err = read()
	}
	return res, err
}

// readRows runs st with args and adds its rows to res within lim.
func readRows(ctx context.Context, st driver.Stmt, args []driver.NamedValue, names [][]byte, lim QueryLimits, res *QueryResult) error {
	sq, ok := st.(driver.StmtQueryContext)
	if !ok {
		return errors.New("the SQLite driver cannot query with a context")
	}
	rows, err := sq.QueryContext(ctx, args)
	if err != nil {
		return err
	}
	defer rows.Close()
	if cols := rows.Columns(); !slices.Equal(cols, res.Columns) {
		return &columnsChanged{slices.Clone(cols)}
	}
	vals := make([]driver.Value, len(res.Columns))
	var buf []byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch err := rows.Next(vals); {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
		if len(res.Rows) == lim.MaxRows {
			res.Truncated = "rows"
			return nil
		}
		if buf, err = appendRow(buf[:0], names, vals); err != nil {
			return err
		}
		if res.Bytes+len(buf) > lim.MaxBytes {
			res.Truncated = "bytes"
			return nil
		}
		res.Rows = append(res.Rows, json.RawMessage(slices.Clone(buf)))
		res.Bytes += len(buf)
	}
}

// encodedNames are the columns' names as JSON strings followed by ':'.
func encodedNames(cols []string) [][]byte {
	out := make([][]byte, len(cols))
	for i, c := range cols {
		b, _ := json.Marshal(c) // a string always encodes
		out[i] = append(b, ':')
	}
	return out
}

// appendRow appends one row to b as a JSON object, its columns in order.
func appendRow(b []byte, names [][]byte, vals []driver.Value) ([]byte, error) {
	b = append(b, '{')
	for i, v := range vals {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, names[i]...)
		var err error
		if b, err = appendValue(b, v); err != nil {
			return nil, fmt.Errorf("encode column %s: %w", names[i], err)
		}
	}
	return append(b, '}'), nil
}

// appendValue appends v as encoding/json encodes it, byte for byte,
// without its reflection for the values SQLite gives most (integers,
// plain text, reals, NULL); an infinite real is the string "Infinity" or
// "-Infinity".
func appendValue(b []byte, v driver.Value) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case string:
		if plainJSON(x) {
			b = append(b, '"')
			b = append(b, x...)
			return append(b, '"'), nil
		}
	case float64:
		if math.IsInf(x, 0) {
			v = "Infinity"
			if x < 0 {
				v = "-Infinity"
			}
		} else if a := math.Abs(x); a == 0 || a >= 1e-6 && a < 1e21 {
			// encoding/json's own rule: these take no exponent.
			return strconv.AppendFloat(b, x, 'f', -1, 64), nil
		}
	}
	e, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, e...), nil
}

// plainJSON reports whether s encodes as a JSON string as it is, between
// quotes: printable ASCII and none of what encoding/json escapes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// columnsChanged: the statement's result columns are no longer those it
// was checked with, but these.
type columnsChanged struct{ columns []string }

func (e *columnsChanged) Error() string {
	return fmt.Sprintf("the result columns are now %q", e.columns)
}

// adopt takes cols as q's result columns from now on; two of one name
// are refused as at the check.
func (q *Query) adopt(cols []string) error {
	if dup := duplicate(cols); dup != "" {
		return fmt.Errorf("query %s: %w: two result columns are now named %q (name each with AS)", q.name, ErrQueryRefused, dup)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.columns, q.names = cols, encodedNames(cols)
	return nil
}

// Close releases the query's prepared statements: each query connection
// prepares it again on its next run.
func (q *Query) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.gen++
}
