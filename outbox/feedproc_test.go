package outbox_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// A feed's processor is read back as recorded; a restart forgets the
// feed's positions in the same transaction, keep and adopt do not.
func TestStore_FeedProcessor(t *testing.T) {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(storePath(t, "t.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fp, err := s.FeedProcessor(ctx, "f")
	if err != nil || fp != (outbox.FeedProcessor{}) {
		t.Fatalf("unknown feed: %+v, %v", fp, err)
	}
	info := outbox.FeedInfo{Name: "f", Kind: "file", Source: "/in", Processor: "ledger"}
	if err := s.RegisterFeed(ctx, info); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.SetPosition(ctx, "f", outbox.Checkpoint{Epoch: "e", Position: 42}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	fp, err = s.FeedProcessor(ctx, "f")
	if err != nil || !fp.Known || fp.Recorded || !fp.HasState || fp.Name != "ledger" {
		t.Fatalf("a feed with state, nothing recorded: %+v, %v", fp, err)
	}
	sql := outbox.ProcessorID{Kind: "sql", Fingerprint: "0123456789abcdef"}
	for _, c := range []struct {
		how  string
		id   outbox.ProcessorID
		name string
		left int
	}{
		{outbox.ProcessorAdopted, outbox.ProcessorID{Kind: "ledger"}, "ledger", 1},
		{outbox.ProcessorKeep, sql, "sql-ledger", 1},
		{outbox.ProcessorRestart, outbox.ProcessorID{Kind: "ledger"}, "ledger", 0},
	} {
		info.Processor = c.name
		if err := s.RecordProcessor(ctx, info, c.id, c.how); err != nil {
			t.Fatal(err)
		}
		fp, err := s.FeedProcessor(ctx, "f")
		if err != nil || !fp.Recorded || fp.ID != c.id || fp.Name != c.name {
			t.Fatalf("%s: %+v, %v; want %+v named %s", c.how, fp, err, c.id, c.name)
		}
		if cps, err := s.Positions(ctx, "f"); err != nil || len(cps) != c.left {
			t.Fatalf("%s: positions %v (%v), want %d", c.how, cps, err, c.left)
		}
	}
}
