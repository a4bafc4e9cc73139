package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/outboxd/outboxd/ingest/ledger"
)

// TestProcessor_Setup shows a restarted processor warming its cache while
// batches commit never reads back a balance older than one it committed:
// every account is changed twice, in batches that run while the warm-up
// reads, and each output carries the balance before it plus the amount.
func TestProcessor_Setup(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	const accounts = 20_000 // many warm-up chunks
	first := ledger.New("out")
	tx, err := s.Begin(ctx)
	must(t, err)
	for i := range accounts {
		must(t, apply(t, tx, first, delivery(int64(i+1)), fmt.Sprintf("acct-%d,%d", i, i)))
	}
	must(t, tx.Commit())

	p := ledger.New("out") // a restart: an empty cache
	setup, err := s.Begin(ctx)
	must(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	must(t, p.Setup(wctx, setup))
	must(t, setup.Commit())
	pos := int64(accounts)
	for round := 1; round <= 2; round++ {
		for from := 0; from < accounts; from += 500 {
			tx, err := s.Begin(ctx)
			must(t, err)
			for i := from; i < from+500; i++ {
				pos++
				must(t, apply(t, tx, p, delivery(pos), fmt.Sprintf("acct-%d,1", i)))
			}
			must(t, tx.Commit())
		}
	}
	got := balances(t, s, "f")
	for i := range accounts {
		if b := got[fmt.Sprintf("acct-%d", i)]; b != int64(i)+2 {
			t.Fatalf("acct-%d: stored balance %d, want %d", i, b, i+2)
		}
	}
	all, err := s.Rows(ctx, int64(accounts), 3*accounts)
	must(t, err)
	if len(all) != 2*accounts {
		t.Fatalf("%d outputs after the restart, want %d", len(all), 2*accounts)
	}
	for j, r := range all {
		var o ledger.Output
		must(t, json.Unmarshal(r.Value, &o))
		i, round := j%accounts, j/accounts+1
		if o.Account != fmt.Sprintf("acct-%d", i) || o.Balance != int64(i+round) {
			t.Fatalf("output %d: %s balance %d, want acct-%d balance %d", j, o.Account, o.Balance, i, i+round)
		}
	}
}
