package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

func TestStore_FeedStatus(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f", Kind: "file", Source: "/x", Processor: "p"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	tx := begin(t, s)
	must(t, tx.SetPosition(ctx, "f", outbox.Checkpoint{Partition: 1, Epoch: "e1", Position: 40, End: 50}))
	must(t, tx.SetPosition(ctx, "f", outbox.Checkpoint{Partition: 0, Epoch: "e0", Position: 7, End: 7}))
	must(t, tx.AddStats(ctx, "f", outbox.StatsDelta{Applied: 5, ReplaysSkipped: 1, Retries: 2, DeadLettered: 3,
		CompletionFailures: 1, EpochChanges: 4, LastAppliedAt: clk.Now()}))
	for i := range outbox.MaxSnapshotLosses + 5 {
		must(t, tx.RecordLoss(ctx, outbox.Loss{Feed: "f", Reason: fmt.Sprint("r", i), Epoch: "e0", From: int64(i), To: int64(i + 1)}))
	}
	for i := range 4 {
		tx.SetPlace(place("f", int64(i+1)))
		must(t, tx.Emit(ctx, out("t", "", "v")))
		tx.SetPlace(place("g", int64(i+1)))
		must(t, tx.Emit(ctx, out("t", "", "v")))
	}
	must(t, tx.Commit())
	must(t, s.SetRelayProgress(ctx, "r", 2)) // rows 1 (f) and 2 (g) published

	t.Run("OK", func(t *testing.T) {
		snap, err := s.FeedStatus(ctx, "f", 0)
		must(t, err)
		wantStats := outbox.FeedStats{FeedInfo: outbox.FeedInfo{Name: "f", Kind: "file", Source: "/x", Processor: "p"},
			Applied: 5, ReplaysSkipped: 1, Retries: 2, DeadLettered: 3, CompletionFailures: 1, EpochChanges: 4,
			Lossless: false, LastAppliedAt: clk.Now().UnixNano()}
		if snap.FeedStats != wantStats {
			t.Fatalf("stats %+v, want %+v", snap.FeedStats, wantStats)
		}
		now := clk.Now().UnixNano()
		wantPos := []outbox.Checkpoint{{Partition: 0, Epoch: "e0", Position: 7, End: 7, UpdatedAt: now},
			{Partition: 1, Epoch: "e1", Position: 40, End: 50, UpdatedAt: now}}
		if !reflect.DeepEqual(snap.Positions, wantPos) {
			t.Fatalf("positions %+v, want %+v", snap.Positions, wantPos)
		}
		equal(t, "loss count", snap.LossCount, int64(outbox.MaxSnapshotLosses+5))
		equal(t, "losses kept", len(snap.Losses), outbox.MaxSnapshotLosses)
		// The most recent ones, oldest first.
		equal(t, "first loss kept", snap.Losses[0].Reason, "r5")
		equal(t, "last loss kept", snap.Losses[len(snap.Losses)-1].Reason, fmt.Sprint("r", outbox.MaxSnapshotLosses+4))
		equal(t, "published", snap.Published, int64(2))
		equal(t, "backlog of f", snap.Backlog, outbox.Backlog{Pending: 3, OldestAt: now}) // rows 3, 5, 7
	})

	t.Run("PublishedAhead", func(t *testing.T) {
		snap, err := s.FeedStatus(ctx, "f", 5) // the relay knows rows up to 5 went out
		must(t, err)
		equal(t, "published", snap.Published, int64(5))
		equal(t, "pending", snap.Backlog.Pending, int64(1)) // row 7
	})

	t.Run("NotFound", func(t *testing.T) {
		if _, err := s.FeedStatus(ctx, "nope", 0); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("FeedStatus of an unknown feed = %v, want ErrNotFound", err)
		}
	})

	t.Run("All", func(t *testing.T) {
		snaps, err := s.FeedStatuses(ctx, 0)
		must(t, err)
		equal(t, "feeds", len(snaps), 2)
		equal(t, "first", snaps[0].Name, "f")
		equal(t, "second", snaps[1].Name, "g")
		equal(t, "g lossless", snaps[1].Lossless, true)
		equal(t, "g pending", snaps[1].Backlog.Pending, int64(3)) // rows 4, 6, 8
		equal(t, "g losses", len(snaps[1].Losses), 0)
	})

	t.Run("Outbox", func(t *testing.T) {
		o, err := s.OutboxStatus(ctx, 0)
		must(t, err)
		equal(t, "outbox", o, outbox.OutboxSnapshot{Published: 2, LastID: 8, Backlog: outbox.Backlog{Pending: 6, OldestAt: clk.Now().UnixNano()}})
		p, err := s.PublishedThrough(ctx)
		must(t, err)
		equal(t, "published through", p, int64(2))
	})
}

// Counters, positions and the backlog of a status come from one commit:
// each commit here moves them together, so every answer has them equal,
// while commits go on.
func TestStore_FeedStatusOneSnapshot(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	const commits = 300
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range commits {
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			tx.SetPlace(place("f", int64(i+1)))
			err = errors.Join(tx.Emit(ctx, out("t", "", "v")),
				tx.SetPosition(ctx, "f", outbox.Checkpoint{Epoch: "e", Position: int64(i + 1)}),
				tx.AddStats(ctx, "f", outbox.StatsDelta{Applied: 1}),
				tx.Commit())
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	reads := 0
	for {
		snap, err := s.FeedStatus(ctx, "f", 0)
		must(t, err)
		var pos int64
		if len(snap.Positions) == 1 {
			pos = snap.Positions[0].Position
		}
		// The backlog is the snapshot's, or a slow scan's reused (see
		// Store.Backlog): never one of a later commit.
		if snap.Applied != pos || snap.Backlog.Pending > pos {
			t.Fatalf("applied %d, position %d, pending %d: not from one commit", snap.Applied, pos, snap.Backlog.Pending)
		}
		reads++
		if pos == commits {
			break
		}
	}
	wg.Wait()
	t.Logf("%d consistent reads during %d commits", reads, commits)
}

func TestStore_EachDeadLetter(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	big := bytes.Repeat([]byte("p"), 10_000)
	bigHeaders := outbox.EncodeHeaders([]outbox.Header{{Key: "h", Value: bytes.Repeat([]byte("h"), 300)}})
	smallHeaders := outbox.EncodeHeaders([]outbox.Header{{Key: "h", Value: []byte("v")}})
	id1 := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Position: 1, Attempts: 1, Reason: "malformed",
		Error: "short", Key: []byte("k"), Payload: []byte("small"), Headers: smallHeaders})
	deadLetter(t, s, outbox.DeadLetter{Feed: "g", Epoch: "e", Position: 1, Attempts: 1, Reason: "malformed", Error: "x"})
	id2 := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Position: 2, Attempts: 3, Reason: "retries-exhausted",
		Error: string(bytes.Repeat([]byte("é"), 150)), Key: bytes.Repeat([]byte("k"), 200), Payload: big, Headers: bigHeaders})
	id3 := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Position: 3, Attempts: 1, Reason: "malformed", Error: "e3"})

	var got []outbox.DeadLetterPreview
	collect := func(p outbox.DeadLetterPreview) error { got = append(got, p); return nil }
	must(t, s.EachDeadLetter(ctx, "f", 0, 10, 100, 64, collect))
	at := clk.Now().UnixNano()
	want := []outbox.DeadLetterPreview{
		{DeadLetter: outbox.DeadLetter{ID: id1, Feed: "f", Epoch: "e", Position: 1, Attempts: 1, Reason: "malformed",
			Error: "short", Key: []byte("k"), Payload: []byte("small"), Headers: smallHeaders, At: at},
			KeyBytes: 1, PayloadBytes: 5, HeadersBytes: int64(len(smallHeaders))},
		{DeadLetter: outbox.DeadLetter{ID: id2, Feed: "f", Epoch: "e", Position: 2, Attempts: 3, Reason: "retries-exhausted",
			Error: string(bytes.Repeat([]byte("é"), 100)), Key: bytes.Repeat([]byte("k"), 100), Payload: big[:100], At: at},
			KeyBytes: 200, PayloadBytes: 10_000, HeadersBytes: int64(len(bigHeaders)), ErrorCut: true},
		{DeadLetter: outbox.DeadLetter{ID: id3, Feed: "f", Epoch: "e", Position: 3, Attempts: 1, Reason: "malformed",
			Error: "e3", At: at}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("previews:\n got %+v\nwant %+v", got, want)
	}
	if got[0].KeyCut() || got[0].PayloadCut() || got[0].HeadersCut() {
		t.Fatalf("first preview says it was cut: %+v", got[0])
	}
	if !got[1].KeyCut() || !got[1].PayloadCut() || !got[1].HeadersCut() {
		t.Fatalf("second preview does not say it was cut: %+v", got[1])
	}
	if got[2].KeyCut() || got[2].PayloadCut() || got[2].HeadersCut() {
		t.Fatalf("third preview (no key, payload or headers) says it was cut: %+v", got[2])
	}

	t.Run("AfterAndLimit", func(t *testing.T) {
		got = nil
		must(t, s.EachDeadLetter(ctx, "f", id1, 1, 100, 64, collect))
		equal(t, "previews", len(got), 1)
		equal(t, "id", got[0].ID, id2)
	})

	t.Run("Stop", func(t *testing.T) {
		n := 0
		err := s.EachDeadLetter(ctx, "f", 0, 10, 100, 64, func(outbox.DeadLetterPreview) error {
			n++
			return outbox.ErrStopEach
		})
		must(t, err)
		equal(t, "previews seen", n, 1)
		boom := errors.New("boom")
		if err := s.EachDeadLetter(ctx, "f", 0, 10, 100, 64, func(outbox.DeadLetterPreview) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("EachDeadLetter = %v, want the callback's error", err)
		}
	})

	t.Run("Bytes", func(t *testing.T) {
		var whole []byte
		for off := int64(0); ; {
			b, size, err := s.DeadLetterBytes(ctx, "f", id2, outbox.PartPayload, off, 4096)
			must(t, err)
			equal(t, "size", size, int64(10_000))
			if len(b) == 0 {
				break
			}
			whole = append(whole, b...)
			off += int64(len(b))
		}
		if !bytes.Equal(whole, big) {
			t.Fatalf("payload read in pieces: %d bytes, want the %d stored", len(whole), len(big))
		}
		key, size, err := s.DeadLetterBytes(ctx, "f", id2, outbox.PartKey, 150, 100)
		must(t, err)
		equal(t, "key tail", string(key), string(bytes.Repeat([]byte("k"), 50)))
		equal(t, "key size", size, int64(200))
		if _, _, err := s.DeadLetterBytes(ctx, "g", id2, outbox.PartPayload, 0, 10); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("another feed's dead letter: %v, want ErrNotFound", err)
		}
		if _, _, err := s.DeadLetterBytes(ctx, "f", id2, "headers", 0, 10); err == nil {
			t.Fatal("an unknown part was read")
		}
	})
}
