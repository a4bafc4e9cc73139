package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// QueryConfig is the named read-only state queries the HTTP API serves
// at GET /queries/{name}, and the limits each run keeps within.
type QueryConfig struct {
	Queries map[string]string `yaml:"queries" usage:"NAME: SQL, a read-only SELECT served at GET /queries/NAME, its :params from the query string"`
	// Timeout, MaxRows and MaxBytes bound each run.
	Timeout  time.Duration `yaml:"queryTimeout"`
	MaxRows  int           `yaml:"queryMaxRows"`
	MaxBytes int           `yaml:"queryMaxBytes"`
}

// DefaultQueryConfig is no queries, each run within
// outbox.DefaultQueryLimits: 1s, 1000 rows, 1 MiB.
func DefaultQueryConfig() QueryConfig {
	l := outbox.DefaultQueryLimits()
	return QueryConfig{Queries: map[string]string{}, Timeout: l.Timeout, MaxRows: l.MaxRows, MaxBytes: l.MaxBytes}
}

// flags registers the queries' limits on fs.
func (q *QueryConfig) flags(fs *flag.FlagSet) {
	fs.DurationVar(&q.Timeout, "query-timeout", q.Timeout,
		"a state query's time limit (`D`): past it the statement is interrupted and the answer is 504")
	fs.IntVar(&q.MaxRows, "query-max-rows", q.MaxRows,
		"the most rows (`N`) a state query's answer holds; a longer one is cut and says so")
	fs.IntVar(&q.MaxBytes, "query-max-bytes", q.MaxBytes,
		"the most bytes (`N`) of JSON rows a state query's answer holds; a larger one is cut and says so")
}

// limits are the limits as the store takes them.
func (q QueryConfig) limits() outbox.QueryLimits {
	return outbox.QueryLimits{Timeout: q.Timeout, MaxRows: q.MaxRows, MaxBytes: q.MaxBytes}
}

// names are the queries' names, sorted.
func (q QueryConfig) names() []string {
	out := make([]string, 0, len(q.Queries))
	for n := range q.Queries {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// validate checks what needs no database: the limits, the names, and
// that each query is one SELECT with named parameters.
func (q QueryConfig) validate() error {
	switch {
	case q.Timeout <= 0:
		return fmt.Errorf("--query-timeout: %v, want more than 0", q.Timeout)
	case q.MaxRows < 1:
		return fmt.Errorf("--query-max-rows: %d, want at least 1", q.MaxRows)
	case q.MaxBytes < 1:
		return fmt.Errorf("--query-max-bytes: %d, want at least 1", q.MaxBytes)
	}
	for _, name := range q.names() {
		if !validName(name) {
			return fmt.Errorf("queries.%s: a name is letters, digits, '.', '_' and '-'", name)
		}
		if _, err := outbox.CheckQueryText(q.Queries[name]); err != nil {
			return fmt.Errorf("queries.%s: %w", name, err)
		}
	}
	return nil
}

// loadQueries compiles every configured query on the store's read pool,
// before the database is claimed: a query SQLite refuses (a syntax error,
// a write, two columns of one name) is a *ConfigError. One reading a
// table the database does not hold yet (a processor creates it when its
// feed starts) is served, answering 503 until the table exists: said at
// INFO on a first start (no feed has a position yet, so no processor has
// made its tables), as a warning otherwise (a name mistyped, say).
func (m *Main) loadQueries(ctx context.Context) error {
	for _, name := range m.Config.Query.names() {
		q, err := m.Store.PrepareQuery(ctx, name, m.Config.Query.Queries[name])
		switch {
		case errors.Is(err, outbox.ErrQueryNotReady) && !m.anyFeedStarted(ctx):
			m.Logger.Info("a state query reads a table its processor creates when its feed starts: it answers 503 until then",
				"query", name, "err", err)
		case errors.Is(err, outbox.ErrQueryNotReady):
			m.Logger.Warn("a state query reads what the database does not hold, although its feeds ran before: "+
				"it answers 503 until the database does", "query", name, "err", err)
		case err != nil:
			return configErr("queries.%s: %w", name, unwrapName(err, name))
		}
		m.queries = append(m.queries, q)
	}
	return nil
}

// anyFeedStarted says whether a configured feed has a stored position: a
// feed that ran before, whose processor has set up its tables.
func (m *Main) anyFeedStarted(ctx context.Context) bool {
	for _, name := range m.Config.FeedNames() {
		if cps, err := m.Store.ReadPositions(ctx, name); err != nil || len(cps) > 0 {
			return true // unreadable: warn, as for a feed that ran
		}
	}
	return false
}

// unwrapName drops the store's "query NAME: " prefix, which the key path
// already says.
func unwrapName(err error, name string) error {
	if s, ok := strings.CutPrefix(err.Error(), "query "+name+": "); ok {
		return errors.New(s)
	}
	return err
}

// closeQueries releases the queries' prepared statements.
func (m *Main) closeQueries() {
	for _, q := range m.queries {
		q.Close()
	}
}
