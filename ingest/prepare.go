package ingest

import (
	"context"
	"fmt"

	"github.com/outboxd/outboxd/outbox"
)

// Preparer is implemented by processors that read, once per transaction,
// the state its items are going to need: one key-ordered query for a whole
// batch costs far less than one lookup per item when the state is larger
// than what the processor keeps in memory.
//
// The loop calls Prepare in each transaction, after BEGIN and before the
// first item is applied, with the items the transaction is about to apply
// (in order, without those the guard skips as already applied nor those
// the feed marked bad). It is a hint: the items that follow may be fewer
// (one fails and ends the transaction early), and Apply must still give the
// same result for an item Prepare was not shown. Prepare must only read: a
// write it made would stand outside every item's undo. An error ends the
// transaction as the store's failure (nothing of it is kept, and it is
// tried again as the store's failures are), so return one only when the
// store failed; the items are otherwise applied as if Prepare had not run.
type Preparer interface {
	Prepare(ctx context.Context, tx *outbox.Tx, feed string, items []Item) error
}

// prepare shows the processor, if it is a Preparer, the items of b that
// the transaction w is about to apply.
func (l *Loop) prepare(ctx context.Context, w *work, b batch) error {
	p, ok := l.proc.(Preparer)
	if !ok {
		return nil
	}
	items := l.prepItems[:0]
	for _, r := range b.recs {
		if r.Kind != RecordItem || r.BadReason != "" {
			continue
		}
		cp := w.cps[r.Partition]
		d := Delivery{Epoch: r.Epoch, Position: r.Position}
		if d.AlreadyApplied(cp.Epoch, cp.Position) {
			continue
		}
		items = append(items, r.Item)
	}
	l.prepItems = items[:0]
	defer clear(items) // hold no item's bytes past the transaction
	if len(items) == 0 {
		return nil
	}
	// No deadline: a statement with a context that can be done costs the
	// driver a goroutine to watch it, and one read of committed state in
	// key order cannot hang on an item.
	if err := p.Prepare(context.WithoutCancel(ctx), w.tx, l.cfg.Name, items); err != nil {
		return fmt.Errorf("prepare the batch's state: %w", err)
	}
	return nil
}
