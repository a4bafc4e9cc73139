package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

func TestStore_DiscardDeadLetter(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	a := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Position: 1, Reason: "malformed", Error: "e", Payload: []byte("junk")})
	b := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Position: 2, Reason: "malformed", Error: "e"})
	at := clk.Add(time.Second).UnixNano()
	t.Run("OK", func(t *testing.T) {
		ok, err := s.DiscardDeadLetter(ctx, "f", a, outbox.Discard{By: "alice", Note: "a test line"})
		must(t, err)
		equal(t, "discarded", ok, true)
		d, err := s.DeadLetterByID(ctx, "f", a)
		must(t, err)
		equal(t, "discarded_at", d.DiscardedAt, at)
		equal(t, "by", d.ResolvedBy, "alice")
		equal(t, "note", d.Note, "a test line")
		equal(t, "payload kept", string(d.Payload), "junk")
		equal(t, "requeued_at", d.RequeuedAt, int64(0))
	})
	t.Run("Twice", func(t *testing.T) {
		ok, err := s.DiscardDeadLetter(ctx, "f", a, outbox.Discard{By: "bob"})
		must(t, err)
		equal(t, "discarded again", ok, false)
		d, _ := s.DeadLetterByID(ctx, "f", a)
		equal(t, "by", d.ResolvedBy, "alice")
	})
	t.Run("NotRequeuedOnceDiscarded", func(t *testing.T) {
		tx := begin(t, s)
		ok, err := tx.MarkRequeuedBy(ctx, "f", a, outbox.Requeue{By: "bob"})
		must(t, err)
		must(t, tx.Commit())
		equal(t, "requeued after a discard", ok, false)
	})
	t.Run("NotDiscardedOnceRequeued", func(t *testing.T) {
		tx := begin(t, s)
		ok, err := tx.MarkRequeuedBy(ctx, "f", b, outbox.Requeue{By: "bob", Note: "fixed", Payload: []byte("fixed")})
		must(t, err)
		must(t, tx.Commit())
		equal(t, "requeued", ok, true)
		ok, err = s.DiscardDeadLetter(ctx, "f", b, outbox.Discard{By: "alice"})
		must(t, err)
		equal(t, "discarded after a requeue", ok, false)
		d, _ := s.DeadLetterByID(ctx, "f", b)
		equal(t, "by", d.ResolvedBy, "bob")
		equal(t, "edited payload", string(d.RequeuedPayload), "fixed")
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		for _, c := range []struct {
			feed string
			id   int64
		}{{"g", a}, {"f", b + 1}} {
			if _, err := s.DiscardDeadLetter(ctx, c.feed, c.id, outbox.Discard{}); !errors.Is(err, outbox.ErrNotFound) {
				t.Fatalf("discard %s/%d = %v, want ErrNotFound", c.feed, c.id, err)
			}
		}
	})
}

func TestStore_OpenDeadLetters(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "h"}))
	old := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Reason: "malformed", Error: "e"})
	clk.Add(2 * time.Hour)
	since := clk.Now().Add(-time.Hour)
	var ids []int64
	for i, reason := range []string{"malformed", "line-too-long", "malformed", "malformed"} {
		ids = append(ids, deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Position: int64(i), Reason: reason, Error: "e"}))
	}
	for range 3 {
		deadLetter(t, s, outbox.DeadLetter{Feed: "g", Epoch: "e", Reason: "malformed", Error: "e"})
	}
	if _, err := s.DiscardDeadLetter(ctx, "f", ids[2], outbox.Discard{}); err != nil {
		t.Fatal(err)
	}
	got, err := s.OpenDeadLetters(ctx, since, 2)
	must(t, err)
	want := []outbox.OpenDeadLetterCount{{Feed: "f", N: 2, AtLeast: true}, {Feed: "g", N: 2, AtLeast: true}}
	equal(t, "capped at 2", len(got), 2)
	for i := range want {
		equal(t, "count", got[i], want[i])
	}
	got, err = s.OpenDeadLetters(ctx, since, 10)
	must(t, err)
	// f: 4 in the last hour, one discarded; the old one is outside.
	want = []outbox.OpenDeadLetterCount{{Feed: "f", N: 3}, {Feed: "g", N: 3}}
	equal(t, "feeds", len(got), 2)
	for i := range want {
		equal(t, "count", got[i], want[i])
	}
	open, err := s.OpenDeadLetterIDs(ctx, "f", "malformed", 0, 10)
	must(t, err)
	equal(t, "open malformed", len(open), 3)
	equal(t, "ids", [3]int64{open[0], open[1], open[2]}, [3]int64{old, ids[0], ids[3]})
	open, err = s.OpenDeadLetterIDs(ctx, "f", "", ids[0], 1)
	must(t, err)
	equal(t, "page", len(open) == 1 && open[0] == ids[1], true)
}

func TestStore_AckLossesBy(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	tx := begin(t, s)
	must(t, tx.RecordLoss(ctx, outbox.Loss{Feed: "f", Reason: "truncated", Epoch: "e", From: 3, To: 9}))
	must(t, tx.Commit())
	at := clk.Add(time.Minute).UnixNano()
	n, err := s.AckLossesBy(ctx, "f", outbox.LossAck{By: "alice", Reason: "replayed from the backup"})
	must(t, err)
	equal(t, "acked", n, int64(1))
	ls, err := s.Losses(ctx, "f")
	must(t, err)
	equal(t, "loss", ls[0].AckedAt == at && ls[0].AckedBy == "alice" && ls[0].AckReason == "replayed from the backup", true)
	n, err = s.AckLossesBy(ctx, "f", outbox.LossAck{By: "bob", Reason: "again"})
	must(t, err)
	equal(t, "acked again", n, int64(0))
	ls, _ = s.Losses(ctx, "f")
	equal(t, "first ack kept", ls[0].AckedBy, "alice")
	if _, err := s.AckLossesBy(ctx, "nope", outbox.LossAck{}); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("ack of an unknown feed = %v", err)
	}
}
