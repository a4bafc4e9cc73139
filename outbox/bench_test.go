package outbox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkTx_Emit measures the outbox's hot path: batches of 1,000 items,
// each emitting one output, committed with synchronous=full.
func BenchmarkTx_Emit(b *testing.B) {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	value := []byte(`{"account":"acct-1","amount":5,"balance":5,"feed":"f","epoch":"e","position":10}`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for j := 0; j < 1000 && i < b.N; j, i = j+1, i+1 {
			if err := tx.BeginItem(outbox.Place{Feed: "f", Epoch: "e", Position: int64(i + 1)}); err != nil {
				b.Fatal(err)
			}
			key := fmt.Appendf(nil, "acct-%d", i%1000)
			if err := tx.Emit(ctx, outbox.Output{Topic: "t", Key: key, Value: value}); err != nil {
				b.Fatal(err)
			}
			if err := tx.EndItem(); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}
