package outbox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkStore_Query is one run of a one-row state query by key on a
// table of 10,000 rows: binding, SQLite's steps, the encoding, and the
// watch that interrupts the statement at its time limit or its caller's
// end.
func BenchmarkStore_Query(b *testing.B) {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO ledger_balances VALUES ('l', 'acct-%05d', %d, 1)`, i, i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	q, err := s.PrepareQuery(ctx, "balance", `SELECT account, balance FROM ledger_balances WHERE feed = 'l' AND account = :account`)
	if err != nil {
		b.Fatal(err)
	}
	params := map[string][]string{"account": {"acct-04242"}}
	lim := outbox.DefaultQueryLimits()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := s.Query(ctx, q, params, lim)
		if err != nil || len(res.Rows) != 1 {
			b.Fatalf("%v, %v", res.Rows, err)
		}
	}
}
