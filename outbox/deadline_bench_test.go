package outbox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkTx_BatchDeadline runs items of one Batch call of three
// statements each (a read, an upsert, a read: the SQL ledger's shape), in
// transactions of 1,000 items, with statements bound to an attempt's
// deadline (one context per 100 items, as the loop shares one for a few
// milliseconds) and with no deadline: the difference is what the store's
// deadline watch costs. ns/op is per item.
func BenchmarkTx_BatchDeadline(b *testing.B) {
	read := outbox.NewStatement(`SELECT value FROM meta WHERE key = ?1`)
	upsert := outbox.NewStatement(`INSERT INTO meta (key, value) VALUES (?1, ?2)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("bench-", i)
	}
	for _, bound := range []bool{false, true} {
		b.Run(fmt.Sprintf("deadline=%v", bound), func(b *testing.B) {
			ctx := context.Background()
			s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db")))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var tx *outbox.Tx
			actx, cancel := ctx, context.CancelFunc(func() {})
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%1000 == 0 {
					if tx != nil {
						if err := tx.Commit(); err != nil {
							b.Fatal(err)
						}
					}
					if tx, err = s.Begin(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if bound && i%100 == 0 {
					cancel()
					actx, cancel = context.WithTimeout(ctx, time.Minute)
				}
				if err := tx.BeginItem(outbox.Place{Feed: "f", Epoch: "e", Position: int64(i + 1)}); err != nil {
					b.Fatal(err)
				}
				k := keys[i%len(keys)]
				err := tx.Batch(func(bt *outbox.Batch) error {
					for _, st := range []*outbox.Statement{read, upsert, read} {
						var err error
						if st == upsert {
							err = bt.Exec(actx, st, k, "v")
						} else {
							var rows *outbox.Rows
							if rows, err = bt.Query(actx, st, k); err == nil {
								_, err = rows.Next()
								rows.Close()
							}
						}
						if err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				if err := tx.EndItem(); err != nil {
					b.Fatal(err)
				}
			}
			cancel()
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		})
	}
}
