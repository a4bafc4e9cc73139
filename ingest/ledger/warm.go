package ledger

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

var _ ingest.Setupper = (*Processor)(nil)

// warmChunk is how many balances one read of the warm-up takes. The
// processor's lock is held for each read (about a millisecond), so an item
// waits at most that long.
const warmChunk = 1024

// warmShare is the part of CacheBytes the warm-up fills: the rest is left
// for the balances the batches write, so warming never pushes out what the
// batches just cached.
const warmShare = 0.5

// Setup starts reading the committed balances into the cache, in the
// background, once per processor: after a restart with a large state, the
// accounts the cache holds cost no read. The loop starts at once; items
// whose balance is not cached yet read it from SQLite as before. The
// warm-up stops when ctx is done, at the end of the table, or once it has
// filled its share of the cache.
func (p *Processor) Setup(ctx context.Context, tx *outbox.Tx) error {
	p.warmOnce.Do(func() {
		s := tx.Store()
		go func() {
			if err := p.warm(ctx, s); err != nil && ctx.Err() == nil {
				slog.Default().With("component", "ledger").Warn("warming the balance cache stopped; balances are read as needed", "err", err)
			}
		}()
	})
	return nil
}

// warm reads ledger_balances in key order, chunk by chunk. Each chunk is
// read and cached under the processor's lock, so no commit's balances can
// be overwritten by older ones: a commit whose OnCommit ran before the
// chunk's read is in the read's snapshot, and one that commits later
// caches its balances after the chunk (it waits for the lock).
func (p *Processor) warm(ctx context.Context, s *outbox.Store) error {
	var after balanceKey
	budget := int(float64(CacheBytes) * warmShare)
	for budget > 0 && ctx.Err() == nil {
		n, last, used, err := p.warmChunk(ctx, s, after)
		if err != nil {
			return err
		}
		if n < warmChunk {
			return nil
		}
		after, budget = last, budget-used
	}
	return nil
}

type balanceRow struct {
	Feed    string `db:"feed"`
	Account string `db:"account"`
	Balance int64  `db:"balance"`
}

// warmChunk caches the balances after the given key and returns how many
// there were, the last key and about how many cache bytes they take.
func (p *Processor) warmChunk(ctx context.Context, s *outbox.Store, after balanceKey) (int, balanceKey, int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rows []balanceRow
	err := s.View(ctx, func(r *outbox.ReadTx) error {
		return r.Select(ctx, &rows, `SELECT feed, account, balance FROM ledger_balances
WHERE (feed, account) > (?, ?) ORDER BY feed, account LIMIT ?`, after.feed, after.account, warmChunk)
	})
	if err != nil {
		return 0, after, 0, fmt.Errorf("read balances: %w", err)
	}
	used := 0
	for _, r := range rows {
		k := balanceKey{r.Feed, r.Account}
		p.committed.set(k, r.Balance)
		used += len(r.Feed) + len(r.Account) + 8 + 5 // the entry, its length prefixes
		after = k
	}
	return len(rows), after, used, nil
}
