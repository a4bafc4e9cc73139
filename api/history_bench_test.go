package api_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// BenchmarkRecordHistory is the cost of one history sample, which the
// server takes every second: every feed's status (here 4 feeds, one
// position each, 1000 outputs pending) and the outbox's.
func BenchmarkRecordHistory(b *testing.B) {
	ctx := context.Background()
	s := outboxtest.OpenStore(b, outbox.DefaultConfig(filepath.Join(b.TempDir(), "outboxd.db")))
	for i := range 4 {
		name := fmt.Sprintf("f%d", i)
		if err := s.RegisterFeed(ctx, outbox.FeedInfo{Name: name, Kind: "file"}); err != nil {
			b.Fatal(err)
		}
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.SetPosition(ctx, name, outbox.Checkpoint{Epoch: "e", Position: 100, End: 100}); err != nil {
			b.Fatal(err)
		}
		for j := range 250 {
			if err := tx.Emit(ctx, outbox.Output{Topic: name + ".out", Value: []byte(fmt.Sprint(j))}); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	srv, err := api.New(api.DefaultConfig(), s, nil, nil, quiet())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := srv.RecordHistory(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
