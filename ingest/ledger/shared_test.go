package ledger_test

import (
	"context"
	"maps"
	"testing"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestProcessor_PartitionMovesBack: two servers share a PostgreSQL
// database; a partition goes from a to b and back to a. What a cached of
// its accounts before it left is stale once it is back: a reads the
// balance b committed, and the running balance stays exact.
func TestProcessor_PartitionMovesBack(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	a := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	b := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	pa, pb := ledger.New("out"), ledger.New("out")
	for _, s := range []*outbox.Store{a, b} {
		must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f", Kind: "kafka"}))
	}
	batch := func(s *outbox.Store, p *ledger.Processor, pos int64, line string) {
		t.Helper()
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(pos), line))
		must(t, tx.Commit())
	}
	claim := func(s *outbox.Store, owner string) {
		t.Helper()
		_, err := s.ClaimPartition(ctx, "f", 0, owner)
		must(t, err)
	}
	claim(a, "a")
	batch(a, pa, 1, "acct,5") // a caches 5
	claim(b, "b")
	batch(b, pb, 2, "acct,3") // 8, which a does not know
	claim(a, "a")
	batch(a, pa, 3, "acct,1")
	if got, want := balances(t, a, "f"), map[string]int64{"acct": 9}; !maps.Equal(got, want) {
		t.Fatalf("balances = %v, want %v", got, want)
	}
}
