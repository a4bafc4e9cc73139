package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestPostgres_Query: a state query runs on PostgreSQL in a READ ONLY
// transaction under the run's statement_timeout: named parameters bound
// as text, the limits, a table that is not there yet, a write that hides
// in a WITH refused, a run past its time interrupted.
func TestPostgres_Query(t *testing.T) {
	ctx := context.Background()
	s := pgStore(t, pgtest.New(t).DSN)
	lim := outbox.DefaultQueryLimits()

	q, err := s.PrepareQuery(ctx, "b", `SELECT account, balance FROM balances WHERE balance >= :min AND account <> :skip ORDER BY account`)
	if !errors.Is(err, outbox.ErrQueryNotReady) || q == nil {
		t.Fatalf("a query of a table not there yet = %v, %v; want ErrQueryNotReady and the query", q, err)
	}
	_, err = outboxtest.Exec(ctx, s, `CREATE TABLE balances (account TEXT PRIMARY KEY, balance BIGINT NOT NULL, ok BOOLEAN, at TIMESTAMPTZ, r DOUBLE PRECISION)`)
	testutil.Must(t, err)
	_, err = outboxtest.Exec(ctx, s, `INSERT INTO balances VALUES ('a', 5, true, '2026-05-01T09:00:00Z', 0.5), ('b', 7, false, NULL, NULL), ('c', 1, NULL, NULL, -2.5)`)
	testutil.Must(t, err)
	res, err := s.Query(ctx, q, map[string][]string{"min": {"2"}, "skip": {"x"}}, lim)
	testutil.Must(t, err)
	if got := joinRows(res); got != `{"account":"a","balance":5} {"account":"b","balance":7}` {
		t.Fatalf("rows %s", got)
	}
	if strings.Join(res.Columns, ",") != "account,balance" {
		t.Fatalf("columns %v", res.Columns)
	}

	all, err := s.PrepareQuery(ctx, "all", `SELECT account, ok, at, r, balance * 1.5 AS n FROM balances ORDER BY account`)
	testutil.Must(t, err)
	res, err = s.Query(ctx, all, nil, outbox.QueryLimits{Timeout: time.Second, MaxRows: 2, MaxBytes: 1 << 20})
	testutil.Must(t, err)
	if got := joinRows(res); got != `{"account":"a","ok":true,"at":"2026-05-01T09:00:00Z","r":0.5,"n":7.5} {"account":"b","ok":false,"at":null,"r":null,"n":10.5}` || res.Truncated != "rows" {
		t.Fatalf("rows %s, truncated %q", got, res.Truncated)
	}

	// Refused when it is checked (PrepareQuery, at start), and by the
	// READ ONLY transaction in any case.
	if _, err := s.PrepareQuery(ctx, "w", `WITH d AS (DELETE FROM balances WHERE account <> :a RETURNING account) SELECT count(*) AS n FROM d`); !errors.Is(err, outbox.ErrQueryRefused) {
		t.Fatalf("a query that deletes = %v, want ErrQueryRefused", err)
	}
	nv, err := s.PrepareQuery(ctx, "nv", `SELECT nextval('s') AS n`)
	if err == nil || errors.Is(err, outbox.ErrQueryNotReady) {
		_, err = outboxtest.Exec(ctx, s, `CREATE SEQUENCE s`)
		testutil.Must(t, err)
		_, err = s.Query(ctx, nv, nil, lim)
	}
	if !errors.Is(err, outbox.ErrQueryRefused) {
		t.Fatalf("a query that moves a sequence = %v, want ErrQueryRefused", err)
	}
	var n int
	testutil.Must(t, outboxtest.Get(ctx, s, &n, `SELECT count(*) FROM balances`))
	testutil.Equal(t, "balances after the refused delete", n, 3)

	slow, err := s.PrepareQuery(ctx, "slow", `SELECT count(*) AS n FROM generate_series(1, 100000000000)`)
	testutil.Must(t, err)
	start := time.Now()
	if _, err := s.Query(ctx, slow, nil, outbox.QueryLimits{Timeout: 200 * time.Millisecond, MaxRows: 1, MaxBytes: 1 << 10}); !errors.Is(err, outbox.ErrQueryTimeout) {
		t.Fatalf("a query past its time = %v, want ErrQueryTimeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the timed-out query took %v", d)
	}
}

func joinRows(r outbox.QueryResult) string {
	var parts []string
	for _, row := range r.Rows {
		parts = append(parts, string(row))
	}
	return strings.Join(parts, " ")
}
