package orders

import (
	"context"
	"slices"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Prepare reads, in key order and a few statements, the stored events of
// every order of items that the transaction does not hold yet: each would
// otherwise cost Apply statements of its own. Records without a key are
// left to Apply, which dead-letters them, and so are keys a PostgreSQL
// store cannot keep as text.
func (p *Processor) Prepare(ctx context.Context, tx *outbox.Tx, feed string, items []ingest.Item) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.batchOf(tx)
	seen := make(map[string]struct{}, len(items))
	ids := make([]string, 0, len(items))
	for _, it := range items {
		if len(it.Key) == 0 || (tx.Store().Postgres() && !pgKey(it.Key)) {
			continue
		}
		if _, ok := seen[string(it.Key)]; ok {
			continue
		}
		if _, ok := b.orders[orderKey{feed, string(it.Key)}]; ok {
			continue
		}
		id := string(it.Key)
		seen[id] = struct{}{}
		ids = append(ids, id)
	}
	// Key order: each B-tree page is found once, and the batch's writes
	// find the same pages in SQLite's cache.
	slices.Sort(ids)
	return readHistories(ctx, tx, feed, ids, b.orders)
}
