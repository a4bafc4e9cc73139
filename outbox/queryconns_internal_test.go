package outbox

import (
	"context"
	"path/filepath"
	"testing"
)

// TestQueryConns_Renewed: a query connection database/sql has closed
// under the store (a driver that found it broken) is replaced on its next
// run, which answers, and the pool keeps all its connections.
func TestQueryConns_Renewed(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, DefaultConfig(filepath.Join(t.TempDir(), "q.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	q, err := s.PrepareQuery(ctx, "q", "SELECT 41 + 1 AS n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Query(ctx, q, nil, DefaultQueryLimits()); err != nil {
		t.Fatal(err)
	}
	// Close every connection from under the pool.
	var held []*queryConn
	for range QueryConns {
		c, err := s.queryConn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.conn.Close()
		held = append(held, c)
	}
	for _, c := range held {
		s.putQueryConn(c)
	}
	// Each run finds a broken connection, renews it and answers.
	for i := range 3 * QueryConns {
		res, err := s.Query(ctx, q, nil, DefaultQueryLimits())
		if err != nil || len(res.Rows) != 1 || string(res.Rows[0]) != `{"n":42}` {
			t.Fatalf("run %d: %s, %v", i, res.Rows, err)
		}
	}
	for range QueryConns {
		c := <-s.queries.free
		if err := c.conn.PingContext(ctx); err != nil {
			t.Fatalf("a connection left broken: %v", err)
		}
		s.queries.free <- c
	}
}
