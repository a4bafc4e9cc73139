package api

import (
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// TestQueries_Check: the queries' readiness check counts the runs under
// way and fails once one has lasted past its time limit by more than
// queryOverrun, saying how long.
func TestQueries_Check(t *testing.T) {
	q, err := newQueries(nil, outbox.QueryLimits{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a, b := q.began(), q.began()
	if c := q.check(now); c != (Check{Name: "queries", OK: true, Message: "2 of 3 running"}) {
		t.Fatalf("%+v", c)
	}
	q.ended(a)
	q.running[b] = now.Add(-(time.Second + queryOverrun + 1500*time.Millisecond))
	if c := q.check(now); c != (Check{Name: "queries", Message: "a query has run 7.5s, past its time limit of 1s (1 of 3 running)"}) {
		t.Fatalf("%+v", c)
	}
	q.ended(b)
	if c := q.check(now); c != (Check{Name: "queries", OK: true, Message: "0 of 3 running"}) {
		t.Fatalf("%+v", c)
	}
}
