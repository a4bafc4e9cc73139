package outbox_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkStore_RelayRows reads relay batches of 4000 rows (a file line
// of 13 bytes each, no key, as the forward processor writes them) back
// from SQLite: what a relay behind its cache of recent rows pays per row.
func BenchmarkStore_RelayRows(b *testing.B) {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const n = 4000
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for i := range int64(n) {
		if err := tx.BeginItem(outbox.Place{Feed: "bench", Epoch: "file:2049:1234567:1700000000", Position: (i + 1) * 13}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Emit(ctx, outbox.Output{Topic: "bench.e2e", Value: []byte("acct-17,12345")}); err != nil {
			b.Fatal(err)
		}
		if err := tx.EndItem(); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		rows, err := s.RelayRows(ctx, 0, n)
		if err != nil || len(rows) != n {
			b.Fatalf("read %d rows: %v", len(rows), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
}
