package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// A Batch statement is bound to its context by the store's one watch per
// context: a statement that does not end is interrupted at the deadline,
// and the context's end reaches only its own statements, never those of
// the contexts that follow (the loop ends an attempt's context right
// after the item, as the next one starts).
func TestTx_BatchDeadline(t *testing.T) {
	ctx := context.Background()
	const insert = `INSERT INTO meta (key, value) VALUES (?1, ?2)`

	t.Run("EndsARunawayStatement", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		defer tx.Rollback()
		must(t, tx.BeginItem(place("f", 1)))
		actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := tx.Batch(func(b *outbox.Batch) error {
			rows, err := b.Query(actx, outbox.NewStatement(`WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT count(*) FROM c`))
			if err != nil {
				return err
			}
			defer rows.Close()
			_, err = rows.Next()
			return err
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a statement that never ends: %v, want the deadline", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("the statement ran %v past a 100ms deadline", d)
		}
		must(t, tx.RollbackItem())
		// The connection is not left interrupted: the next item runs.
		must(t, tx.BeginItem(place("f", 2)))
		must(t, tx.Batch(func(b *outbox.Batch) error { return rawExec(b, insert, "after", "v") }))
		must(t, tx.EndItem())
		must(t, tx.Commit())
		equal(t, "rows after the interrupted item", metaCount(t, s, "after"), 1)
	})

	t.Run("EndedContextsLeaveTheNextAlone", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		defer tx.Rollback()
		const items = 3000
		for i := range items {
			must(t, tx.BeginItem(place("f", int64(i+1))))
			ictx, cancel := context.WithTimeout(ctx, time.Minute)
			err := tx.Batch(func(b *outbox.Batch) error {
				key := fmt.Sprint("item-", i)
				if err := rawExecCtx(ictx, b, insert, key, "v"); err != nil {
					return err
				}
				_, err := rawCountCtx(ictx, b, `SELECT count(*) FROM meta WHERE key = ?1`, key)
				return err
			})
			cancel() // as the loop does: its watch may fire during the next item's statements
			if err != nil {
				t.Fatalf("item %d: %v", i+1, err)
			}
			must(t, tx.EndItem())
		}
		must(t, tx.Commit())
		rtx := begin(t, s)
		defer rtx.Rollback()
		var n int64
		must(t, rtx.Get(ctx, &n, `SELECT count(*) FROM meta WHERE key LIKE 'item-%'`))
		equal(t, "rows of the items", n, int64(items))
	})
}
