package outbox_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkTx_Emit measures the outbox's hot path: batches of 1,000 items,
// each emitting one output, committed with synchronous=full (the SQLite
// case of BenchmarkEngine_Emit).
func BenchmarkTx_Emit(b *testing.B) {
	benchEmit(b, filepath.Join(b.TempDir(), "b.db"), nil)
}

// BenchmarkStore_CheckPath measures the check every commit makes that the
// path still names the open database (three stat calls).
func BenchmarkStore_CheckPath(b *testing.B) {
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.CheckPath(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTx_CommitOne measures a commit of one item with one output,
// synchronous=normal (no fsync): what the per-commit checks add to is
// then the cheapest commit there is.
func BenchmarkTx_CommitOne(b *testing.B) {
	ctx := context.Background()
	cfg := outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db"))
	cfg.Synchronous = outbox.SyncNormal
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Claim(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.BeginItem(outbox.Place{Feed: "f", Epoch: "e", Position: int64(i)}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Emit(ctx, outbox.Output{Topic: "t", Value: []byte("v")}); err != nil {
			b.Fatal(err)
		}
		if err := tx.EndItem(); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}
