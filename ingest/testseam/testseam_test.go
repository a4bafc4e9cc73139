package testseam_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/testseam"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestRewound: the rewound feed opens at the rewind, in the stored epoch,
// so it re-delivers exactly the items after it; a partition not rewound,
// or one asked to open before the rewind, opens where asked; the file
// feed's Waiter and ItemSizer answer through it.
func TestRewound(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "in.csv")
	opts := filefeed.Options{PollInterval: 5 * time.Millisecond, MaxLine: 4096}
	absent := testseam.Rewound(filefeed.New(path, opts), map[int32]int64{0: 2})
	if err := absent.Open(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if why := absent.(ingest.Waiter).Waiting(); !strings.Contains(why, path) {
		t.Fatalf("Waiting through the wrapper = %q, want the file feed's reason naming %s", why, path)
	}
	if got := absent.(ingest.ItemSizer).MaxItemBytes(); got != 4096 {
		t.Fatalf("MaxItemBytes through the wrapper = %d, want 4096", got)
	}
	absent.Close()

	if err := os.WriteFile(path, []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	first := filefeed.New(path, opts)
	recs := pollItems(t, first, nil, 3)
	epoch := recs[0].Epoch
	for _, tc := range []struct {
		name   string
		at     int64
		stored int64
		want   []string
	}{
		{"RewoundBeforeTheStored", 2, 6, []string{"b", "c"}},
		{"StoredBeforeTheRewind", 4, 2, []string{"b", "c"}},
		{"RewoundToTheStart", 0, 4, []string{"a", "b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := testseam.Rewound(filefeed.New(path, opts), map[int32]int64{0: tc.at})
			got := pollItems(t, f, map[int32]outbox.Checkpoint{0: {Epoch: epoch, Position: tc.stored}}, len(tc.want))
			var vals []string
			for _, r := range got {
				vals = append(vals, string(r.Item.Value))
			}
			if strings.Join(vals, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("items %q, want %q", vals, tc.want)
			}
		})
	}
}

// pollItems opens f from, reads n items and closes it.
func pollItems(t *testing.T, f ingest.Feed, from map[int32]outbox.Checkpoint, n int) []ingest.Record {
	t.Helper()
	defer f.Close()
	ctx := context.Background()
	if err := f.Open(ctx, from); err != nil {
		t.Fatal(err)
	}
	var items []ingest.Record
	buf := make([]ingest.Record, 0, 16)
	testutil.Wait(t, 10*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		var err error
		buf, err = f.Poll(pctx, buf[:0], 16)
		for _, r := range buf {
			if r.Kind == ingest.RecordItem {
				items = append(items, r)
			}
		}
		if len(items) < n {
			return err
		}
		return nil
	})
	if len(items) != n {
		t.Fatalf("%d items, want %d", len(items), n)
	}
	return items
}

// TestMoveBack: the stored position moves back in its epoch; a position at
// or past the stored one, or a partition never stored, is an error.
func TestMoveBack(t *testing.T) {
	ctx := context.Background()
	s := outboxtest.TempStore(t)
	if err := s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f", Kind: ingest.KindFile, Source: "x", Processor: "p"}); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.SetPosition(ctx, "f", outbox.Checkpoint{Partition: 0, Epoch: "e1", Position: 9}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := testseam.MoveBack(ctx, s, "f", 0, 9); err == nil {
		t.Fatal("moving back to the stored position: no error")
	}
	if err := testseam.MoveBack(ctx, s, "f", 1, 3); err == nil {
		t.Fatal("moving back a partition never stored: no error")
	}
	if err := testseam.MoveBack(ctx, s, "f", 0, 3); err != nil {
		t.Fatal(err)
	}
	cps, err := s.Positions(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if c := cps[0]; c.Epoch != "e1" || c.Position != 3 {
		t.Fatalf("stored %+v, want e1 at 3", c)
	}
}
