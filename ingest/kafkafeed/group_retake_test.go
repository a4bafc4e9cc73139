package kafkafeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// applyBatch applies values at feed g's partition 0 from position from, as
// the ingest loop does (one output per item, then the position after the
// last), and commits.
func applyBatch(s *outbox.Store, from int64, vs ...string) error {
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for i, v := range vs {
		if err := tx.BeginItem(outbox.Place{Feed: "g", Partition: 0, Epoch: "e", Position: from + int64(i) + 1}); err != nil {
			return err
		}
		if err := tx.Emit(ctx, outbox.Output{Topic: "out", Key: []byte("k"), Value: []byte(v)}); err != nil {
			return err
		}
		if err := tx.EndItem(); err != nil {
			return err
		}
	}
	if err := tx.SetPosition(ctx, "g", outbox.Checkpoint{Partition: 0, Epoch: "e", Position: from + int64(len(vs))}); err != nil {
		return err
	}
	return tx.Commit()
}

// TestGroupFeed_RetakeWaitsForBatchInHand: server a releases partition 0
// while a batch of it (positions 1..3) is still in hand (the revoke's wait
// timed out); b claims it and applies positions 1..5; the group gives it
// back to a. a's new claim waits until its old batch is settled: the old
// batch's commit meets a partition a does not hold, fails with
// ErrPartitionFenced and commits nothing; Dropped reports it, and only then
// does a claim the partition again (epoch 3) and read b's position 5.
func TestGroupFeed_RetakeWaitsForBatchInHand(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	a := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	b := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	for _, s := range []*outbox.Store{a, b} {
		testutil.Must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g", Kind: "kafka"}))
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	g := NewGroup(GroupConfig{Config: Config{Topic: "orders", Logger: log}, Feed: "g", Store: a, Owner: "a",
		RebalanceTimeout: time.Millisecond})
	defer g.Close()

	epoch, err := a.ClaimPartition(ctx, "g", 0, "a")
	testutil.Must(t, err)
	testutil.Equal(t, "a's epoch", epoch, int64(1))
	gp := &groupPart{p: 0, epoch: "e", active: true, space: make(chan struct{}, 1), rewind: make(chan struct{}, 1)}
	g.mu.Lock()
	g.parts[0] = gp
	gp.recs = []ingest.Record{{Kind: ingest.RecordItem, Partition: 0, Epoch: "e", Position: 1},
		{Kind: ingest.RecordItem, Partition: 0, Epoch: "e", Position: 2},
		{Kind: ingest.RecordItem, Partition: 0, Epoch: "e", Position: 3}}
	inHand := g.take1(nil, 10) // the batch in hand: yielded, not committed
	g.mu.Unlock()
	testutil.Equal(t, "records in hand", len(inHand), 3)

	g.release(gp, log.With(logPartition, 0)) // the wait for the batch times out
	testutil.Equal(t, "partitions a holds after the release", len(a.HeldPartitions("g")), 0)

	epoch, err = b.ClaimPartition(ctx, "g", 0, "b")
	testutil.Must(t, err)
	testutil.Equal(t, "b's epoch", epoch, int64(2))
	testutil.Must(t, applyBatch(b, 0, "b1", "b2", "b3", "b4", "b5"))

	retaken := make(chan error, 1)
	go func() { // the group gives partition 0 back to a: take's claim
		if err := g.settle(ctx, 0); err != nil {
			retaken <- err
			return
		}
		e, err := a.ClaimPartition(ctx, "g", 0, "a")
		if err == nil && e != 3 {
			err = fmt.Errorf("a's new epoch %d, want 3", e)
		}
		retaken <- err
	}()
	testutil.Wait(t, 10*time.Second, func() error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.waiters != 1 {
			return fmt.Errorf("%d claims waiting, want 1", g.waiters)
		}
		return nil
	})
	select {
	case err := <-retaken:
		t.Fatalf("a claimed partition 0 again with its old batch unsettled (%v)", err)
	default:
	}

	// a's old batch commits now: fenced, nothing of it stands.
	if err := applyBatch(a, 0, "stale1", "stale2", "stale3"); !errors.Is(err, outbox.ErrPartitionFenced) {
		t.Fatalf("the old batch's commit = %v, want ErrPartitionFenced", err)
	}
	g.Dropped(ctx, inHand)
	testutil.Must(t, <-retaken)

	cps, err := a.Positions(ctx, "g")
	testutil.Must(t, err)
	testutil.Equal(t, "position a resumes from", cps[0].Position, int64(5))
	rows, err := a.Rows(ctx, 0, 100)
	testutil.Must(t, err)
	var got []string
	for _, r := range rows {
		got = append(got, string(r.Value))
	}
	testutil.Equal(t, "outputs", fmt.Sprint(got), "[b1 b2 b3 b4 b5]")
}

// TestGroupFeed_PendingSettledByCommit: a batch in hand that commits after
// its partition's release timed out (before the release reached the
// store) settles the partition as well; a claim waiting for it ends with
// its context when nothing settles it.
func TestGroupFeed_PendingSettledByCommit(t *testing.T) {
	g := NewGroup(GroupConfig{Config: Config{Topic: "orders"}, Feed: "g"})
	defer g.Close()
	g.mu.Lock()
	g.pending[0] = &groupPart{p: 0, epoch: "e", yielded: 3}
	g.pending[1] = &groupPart{p: 1, epoch: "e", yielded: 3}
	g.mu.Unlock()
	testutil.Must(t, g.Commit(context.Background(), []outbox.Checkpoint{{Partition: 0, Epoch: "e", Position: 2}}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.settle(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("settle with 2 of 3 committed = %v, want context.Canceled", err)
	}
	testutil.Must(t, g.Commit(context.Background(), []outbox.Checkpoint{{Partition: 0, Epoch: "other", Position: 3}}))
	if err := g.settle(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("settle after another epoch's commit = %v, want context.Canceled", err)
	}
	testutil.Must(t, g.Commit(context.Background(), []outbox.Checkpoint{{Partition: 0, Epoch: "e", Position: 3}}))
	testutil.Must(t, g.settle(ctx, 0))
	if err := g.settle(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("settle of partition 1 = %v, want context.Canceled", err)
	}
}
