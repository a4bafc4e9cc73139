package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// emitMany commits n rows of one item each at positions 1..n of feed, all
// created at the clock's current time.
func emitMany(t *testing.T, s *outbox.Store, feed string, n int) {
	t.Helper()
	ctx := context.Background()
	tx := begin(t, s)
	for i := range n {
		tx.SetPlace(place(feed, int64(i+1)))
		must(t, tx.Emit(ctx, out("t", "", fmt.Sprint(i+1))))
	}
	must(t, tx.Commit())
}

func ids(rows []outbox.Row) []int64 {
	var is []int64
	for _, r := range rows {
		is = append(is, r.ID)
	}
	return is
}

func TestStore_Rows(t *testing.T) {
	ctx := context.Background()

	t.Run("Paging", func(t *testing.T) {
		s, _ := openStore(t)
		emitMany(t, s, "f", 5)
		for _, c := range []struct {
			after int64
			limit int
			want  []int64
		}{
			{0, 2, []int64{1, 2}},
			{2, 2, []int64{3, 4}},
			{4, 2, []int64{5}},
			{5, 2, nil},
			{0, 100, []int64{1, 2, 3, 4, 5}},
			{3, 1, []int64{4}},
			{0, 0, nil},
			{-1, 1, []int64{1}},
		} {
			rows, err := s.Rows(ctx, c.after, c.limit)
			must(t, err)
			if rows == nil {
				t.Fatalf("Rows(%d, %d) = nil, want a non-nil slice", c.after, c.limit)
			}
			if got := ids(rows); !slices.Equal(got, c.want) {
				t.Fatalf("Rows(%d, %d) ids = %v, want %v", c.after, c.limit, got, c.want)
			}
			for _, r := range rows {
				equal(t, "value", string(r.Value), fmt.Sprint(r.ID))
			}
		}
	})

	t.Run("OnlyCommitted", func(t *testing.T) {
		s, _ := openStore(t)
		emitMany(t, s, "f", 1)
		tx := begin(t, s)
		tx.SetPlace(place("f", 2))
		must(t, tx.Emit(ctx, out("t", "", "pending")))
		// The writer is held; the read pool answers at once, without the
		// uncommitted row.
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		rows, err := s.Rows(rctx, 0, 10)
		must(t, err)
		if got := ids(rows); !slices.Equal(got, []int64{1}) {
			t.Fatalf("ids = %v, want [1]", got)
		}
		must(t, tx.Commit())
		rows, err = s.Rows(ctx, 0, 10)
		must(t, err)
		if got := ids(rows); !slices.Equal(got, []int64{1, 2}) {
			t.Fatalf("ids after commit = %v, want [1 2]", got)
		}
	})

	t.Run("AllColumns", func(t *testing.T) {
		s, clk := openStore(t)
		hs := []outbox.Header{{Key: "h", Value: []byte("v")}}
		emit(t, s, outbox.Place{Feed: "f", Partition: 2, Epoch: "ep", Position: 9},
			outbox.Output{Topic: "top", Key: []byte{0, 1}, Value: []byte{2, 0, 3}, Headers: hs})
		rows, err := s.Rows(ctx, 0, 1)
		must(t, err)
		want := outbox.Row{ID: 1, Feed: "f", Partition: 2, Epoch: "ep", Position: 9, N: 0, Topic: "top",
			Key: []byte{0, 1}, Value: []byte{2, 0, 3}, Headers: outbox.EncodeHeaders(hs), CreatedAt: clk.Now().UnixNano()}
		if len(rows) != 1 || fmt.Sprintf("%+v", rows[0]) != fmt.Sprintf("%+v", want) {
			t.Fatalf("rows = %+v, want [%+v]", rows, want)
		}
	})

	t.Run("NilKeyAndValueStayNil", func(t *testing.T) {
		s, _ := openStore(t)
		emit(t, s, place("f", 1), outbox.Output{Topic: "t"})
		rows, err := s.Rows(ctx, 0, 1)
		must(t, err)
		if rows[0].Key != nil || rows[0].Value != nil || rows[0].Headers != nil {
			t.Fatalf("row = %+v, want nil key, value and headers", rows[0])
		}
	})

	// The relay publishes a nil key as a null key (round-robin partitioning)
	// and a nil value as a null value (a tombstone in a compacted topic); an
	// empty one it publishes as empty. An output's empty key or value must
	// come back from the outbox empty, not nil.
	t.Run("EmptyKeyAndValueAreNotNull", func(t *testing.T) {
		s, _ := openStore(t)
		emit(t, s, place("f", 1), outbox.Output{Topic: "t", Key: []byte{}, Value: []byte{}})
		if !outboxtest.OnPostgres() { // PostgreSQL's outbox holds packed chunks only
			var types []string
			must(t, outbox.WriterOf(s).Select(&types, `SELECT typeof(key) || ',' || typeof(value) FROM outbox`))
			// Stored right: zero-length blobs, not NULL.
			if !slices.Equal(types, []string{"blob,blob"}) {
				t.Fatalf("stored types = %q, want [blob,blob]", types)
			}
		}
		rows, err := s.Rows(ctx, 0, 1)
		must(t, err)
		if rows[0].Key == nil || rows[0].Value == nil {
			t.Fatalf("empty key/value read back as nil (key nil: %v, value nil: %v): the relay would publish a null key and a tombstone",
				rows[0].Key == nil, rows[0].Value == nil)
		}
	})
}

func TestStore_LastOutboxID(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	last := func() int64 {
		t.Helper()
		id, err := s.LastOutboxID(ctx)
		must(t, err)
		return id
	}
	equal(t, "LastOutboxID of an empty outbox", last(), 0)
	emitMany(t, s, "f", 3)
	equal(t, "LastOutboxID", last(), 3)

	n, err := s.Prune(ctx, 3, clk.Now().Add(time.Nanosecond))
	must(t, err)
	equal(t, "pruned", n, 3)
	equal(t, "rows after prune", len(allRows(t, s)), 0)
	equal(t, "LastOutboxID after prune", last(), 3)

	emitMany(t, s, "f", 1)
	if got := ids(allRows(t, s)); !slices.Equal(got, []int64{4}) {
		t.Fatalf("ids after prune = %v, want [4]", got)
	}
	equal(t, "LastOutboxID", last(), 4)
}

func TestStore_Prune(t *testing.T) {
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		s, clk := openStore(t)
		// More than two deletes' worth of old rows, then three newer ones,
		// each a chunk of its own (a chunk goes once its last row may).
		const old = 2*1000*64 + 1
		t0 := clk.Now()
		emitMany(t, s, "f", old)
		t1 := clk.Add(time.Second)
		for range 3 {
			emitMany(t, s, "f", 1)
		}

		// id <= through, created_at < cutoff: all the old rows, not the
		// first newer one though its id is within through.
		n, err := s.Prune(ctx, old+1, t1)
		must(t, err)
		equal(t, "pruned", n, int64(old))
		if got := ids(allRows(t, s)); !slices.Equal(got, []int64{old + 1, old + 2, old + 3}) {
			t.Fatalf("ids left = %v", got)
		}

		// Now only id limits it.
		n, err = s.Prune(ctx, old+2, t1.Add(time.Nanosecond))
		must(t, err)
		equal(t, "pruned", n, 2)
		if got := ids(allRows(t, s)); !slices.Equal(got, []int64{old + 3}) {
			t.Fatalf("ids left = %v", got)
		}

		// Nothing left to prune.
		n, err = s.Prune(ctx, old+2, t1.Add(time.Hour))
		must(t, err)
		equal(t, "pruned", n, 0)
		n, err = s.Prune(ctx, old+3, t0)
		must(t, err)
		equal(t, "pruned before the oldest row", n, 0)
		equal(t, "rows", len(allRows(t, s)), 1)
	})

	t.Run("ExactChunk", func(t *testing.T) {
		s, clk := openStore(t)
		emitMany(t, s, "f", 1000*64)
		n, err := s.Prune(ctx, 1000*64, clk.Now().Add(time.Nanosecond))
		must(t, err)
		equal(t, "pruned", n, 1000*64)
		equal(t, "rows", len(allRows(t, s)), 0)
	})

	t.Run("ChunkGoesWhole", func(t *testing.T) {
		// Rows 1..64 are one chunk, 65..70 another: a chunk goes once
		// its last row is published, never in part.
		s, clk := openStore(t)
		emitMany(t, s, "f", 70)
		cutoff := clk.Now().Add(time.Nanosecond)
		n, err := s.Prune(ctx, 63, cutoff)
		must(t, err)
		equal(t, "pruned through 63", n, 0)
		n, err = s.Prune(ctx, 69, cutoff)
		must(t, err)
		equal(t, "pruned through 69", n, 64)
		if got := ids(allRows(t, s)); !slices.Equal(got, []int64{65, 66, 67, 68, 69, 70}) {
			t.Fatalf("ids left = %v", got)
		}
	})

	t.Run("CutoffIsExclusive", func(t *testing.T) {
		s, clk := openStore(t)
		emitMany(t, s, "f", 2)
		n, err := s.Prune(ctx, 2, clk.Now())
		must(t, err)
		equal(t, "pruned at created_at == cutoff", n, 0)
	})
}

func TestStore_SetRelayProgress(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	progress := func(relay string) int64 {
		t.Helper()
		id, err := s.RelayProgress(ctx, relay)
		must(t, err)
		return id
	}
	equal(t, "progress of an unknown relay", progress("r"), 0)
	for _, c := range []struct{ set, want int64 }{{10, 10}, {5, 10}, {10, 10}, {0, 10}, {20, 20}} {
		must(t, s.SetRelayProgress(ctx, "r", c.set))
		equal(t, fmt.Sprintf("progress after setting %d", c.set), progress("r"), c.want)
	}
	must(t, s.SetRelayProgress(ctx, "other", 3))
	equal(t, "progress of other", progress("other"), 3)
	equal(t, "progress of r", progress("r"), 20)
}

func TestStore_Backlog(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	backlog := func(feed string, after int64) outbox.Backlog {
		t.Helper()
		b, err := s.Backlog(ctx, feed, after)
		must(t, err)
		return b
	}
	equal(t, "empty backlog", backlog("", 0), outbox.Backlog{})
	equal(t, "empty backlog of a feed", backlog("a", 0), outbox.Backlog{})

	t0 := clk.Now().UnixNano()
	emit(t, s, place("a", 1), out("t", "", "1")) // id 1 at t0
	clk.Add(time.Second)
	emit(t, s, place("b", 1), out("t", "", "2")) // id 2 at t0+1s
	clk.Add(time.Second)
	emit(t, s, place("a", 2), out("t", "", "3"), out("t", "", "4")) // ids 3, 4 at t0+2s
	t1, t2 := t0+int64(time.Second), t0+2*int64(time.Second)

	for _, c := range []struct {
		feed  string
		after int64
		want  outbox.Backlog
	}{
		{"", 0, outbox.Backlog{Pending: 4, OldestAt: t0}},
		{"", 1, outbox.Backlog{Pending: 3, OldestAt: t1}},
		{"", 2, outbox.Backlog{Pending: 2, OldestAt: t2}},
		{"", 4, outbox.Backlog{}},
		{"a", 0, outbox.Backlog{Pending: 3, OldestAt: t0}},
		{"a", 1, outbox.Backlog{Pending: 2, OldestAt: t2}},
		{"b", 0, outbox.Backlog{Pending: 1, OldestAt: t1}},
		{"b", 2, outbox.Backlog{}},
		{"c", 0, outbox.Backlog{}},
	} {
		equal(t, fmt.Sprintf("Backlog(%q, %d)", c.feed, c.after), backlog(c.feed, c.after), c.want)
	}
}

// feedStats reads a feed, failing the test on error.
func feedStats(t *testing.T, s *outbox.Store, name string) outbox.FeedStats {
	t.Helper()
	f, err := s.Feed(context.Background(), name)
	must(t, err)
	return f
}

func TestStore_RegisterFeed(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	info := outbox.FeedInfo{Name: "f", Kind: "file", Source: "/in.log", Processor: "ledger"}
	must(t, s.RegisterFeed(ctx, info))
	equal(t, "new feed", feedStats(t, s, "f"), outbox.FeedStats{FeedInfo: info, Lossless: true})

	at := clk.Now()
	tx := begin(t, s)
	must(t, tx.AddStats(ctx, "f", outbox.StatsDelta{Applied: 5, Retries: 1, LastAppliedAt: at}))
	must(t, tx.SetPosition(ctx, "f", outbox.Checkpoint{Epoch: "e", Position: 50, End: 60}))
	must(t, tx.Commit())
	must(t, s.SetLastError(ctx, "f", "boom"))

	// Registering again updates the description and keeps the rest.
	info2 := outbox.FeedInfo{Name: "f", Kind: "kafka", Source: "broker:9092/topic", Processor: "forward"}
	must(t, s.RegisterFeed(ctx, info2))
	equal(t, "re-registered feed", feedStats(t, s, "f"), outbox.FeedStats{
		FeedInfo: info2, Applied: 5, Retries: 1, Lossless: true, LastAppliedAt: at.UnixNano(), LastError: "boom"})
	cps, err := s.Positions(ctx, "f")
	must(t, err)
	equal(t, "position kept", cps[0], outbox.Checkpoint{Epoch: "e", Position: 50, End: 60, UpdatedAt: at.UnixNano()})

	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "a"}))
	fs, err := s.Feeds(ctx)
	must(t, err)
	var names []string
	for _, f := range fs {
		names = append(names, f.Name)
	}
	if !slices.Equal(names, []string{"a", "f"}) {
		t.Fatalf("Feeds() names = %q, want [a f]", names)
	}

	t.Run("ErrNotFound", func(t *testing.T) {
		_, err := s.Feed(ctx, "nope")
		if !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("Feed(nope) = %v, want ErrNotFound", err)
		}
		equal(t, "error", err.Error(), "feed nope: not found")
	})
}

func TestTx_SetPosition(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	t0 := clk.Now().UnixNano()
	tx := begin(t, s)
	must(t, tx.SetPosition(ctx, "f", outbox.Checkpoint{Partition: 1, Epoch: "e1", Position: 10, End: 11}))
	must(t, tx.SetPosition(ctx, "f", outbox.Checkpoint{Partition: 0, Epoch: "e0", Position: 5}))
	must(t, tx.Commit())
	t1 := clk.Add(time.Second).UnixNano()
	tx = begin(t, s)
	must(t, tx.SetPosition(ctx, "f", outbox.Checkpoint{Partition: 1, Epoch: "e2", Position: 3, End: 4}))
	must(t, tx.Commit())

	want := []outbox.Checkpoint{
		{Partition: 0, Epoch: "e0", Position: 5, UpdatedAt: t0},
		{Partition: 1, Epoch: "e2", Position: 3, End: 4, UpdatedAt: t1},
	}
	m, err := s.Positions(ctx, "f")
	must(t, err)
	equal(t, "positions", len(m), 2)
	for _, c := range want {
		equal(t, fmt.Sprintf("position of partition %d", c.Partition), m[c.Partition], c)
	}
	rs, err := s.ReadPositions(ctx, "f")
	must(t, err)
	if !slices.Equal(rs, want) {
		t.Fatalf("ReadPositions = %+v, want %+v", rs, want)
	}

	t.Run("ErrUnknownFeed", func(t *testing.T) {
		tx := begin(t, s)
		err := tx.SetPosition(ctx, "nope", outbox.Checkpoint{Epoch: "e"})
		if outbox.Classify(err) != outbox.ClassConstraint || !strings.Contains(err.Error(), foreignKeyFailed()) {
			t.Fatalf("SetPosition of an unknown feed = %v, want a foreign key error", err)
		}
	})
}

func TestTx_AddStats(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	add := func(feed string, d outbox.StatsDelta) error {
		t.Helper()
		tx := begin(t, s)
		if err := tx.AddStats(ctx, feed, d); err != nil {
			return err
		}
		return tx.Commit()
	}

	t.Run("OK", func(t *testing.T) {
		late := clk.Now()
		must(t, add("f", outbox.StatsDelta{Applied: 1, ReplaysSkipped: 2, Retries: 3, DeadLettered: 4,
			CompletionFailures: 5, EpochChanges: 6, LastAppliedAt: late}))
		// An earlier time does not move last_applied_at back; none keeps it.
		must(t, add("f", outbox.StatsDelta{Applied: 10, LastAppliedAt: late.Add(-time.Hour)}))
		must(t, add("f", outbox.StatsDelta{Retries: 1}))
		equal(t, "stats", feedStats(t, s, "f"), outbox.FeedStats{FeedInfo: outbox.FeedInfo{Name: "f"},
			Applied: 11, ReplaysSkipped: 2, Retries: 4, DeadLettered: 4, CompletionFailures: 5, EpochChanges: 6,
			Lossless: true, LastAppliedAt: late.UnixNano()})
	})

	t.Run("ZeroDeltaChangesNothing", func(t *testing.T) {
		before := feedStats(t, s, "f")
		must(t, add("f", outbox.StatsDelta{}))
		must(t, add("nope", outbox.StatsDelta{}))
		equal(t, "stats", feedStats(t, s, "f"), before)
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		err := add("nope", outbox.StatsDelta{Applied: 1})
		if !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("AddStats of an unknown feed = %v, want ErrNotFound", err)
		}
		equal(t, "error", err.Error(), "update stats of nope: feed not found")
	})
}

func TestStatsDelta_Add(t *testing.T) {
	t0 := time.Unix(100, 0)
	d := outbox.StatsDelta{Applied: 1, LastAppliedAt: t0}
	if d.Zero() {
		t.Fatal("non-zero delta reports Zero")
	}
	d.Add(outbox.StatsDelta{Applied: 2, ReplaysSkipped: 1, Retries: 1, DeadLettered: 1, CompletionFailures: 1, EpochChanges: 1,
		LastAppliedAt: t0.Add(-time.Second)})
	want := outbox.StatsDelta{Applied: 3, ReplaysSkipped: 1, Retries: 1, DeadLettered: 1, CompletionFailures: 1, EpochChanges: 1, LastAppliedAt: t0}
	equal(t, "sum", d, want)
	d.Add(outbox.StatsDelta{LastAppliedAt: t0.Add(time.Second)})
	equal(t, "LastAppliedAt", d.LastAppliedAt, t0.Add(time.Second))
	if !(outbox.StatsDelta{}).Zero() {
		t.Fatal("zero delta does not report Zero")
	}
}

func TestTx_RecordLoss(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	tx := begin(t, s)
	must(t, tx.RecordLoss(ctx, outbox.Loss{ID: 99, Feed: "f", Partition: 2, At: 1, Reason: "truncated", Epoch: "e", From: 10, To: 20, AckedAt: 5}))
	must(t, tx.Commit())

	equal(t, "lossless of f", feedStats(t, s, "f").Lossless, false)
	equal(t, "lossless of g", feedStats(t, s, "g").Lossless, true)
	ls, err := s.Losses(ctx, "f")
	must(t, err)
	// ID, At and AckedAt are the store's, not the caller's.
	want := []outbox.Loss{{ID: 1, Feed: "f", Partition: 2, At: clk.Now().UnixNano(), Reason: "truncated", Epoch: "e", From: 10, To: 20}}
	if !slices.Equal(ls, want) {
		t.Fatalf("losses = %+v, want %+v", ls, want)
	}

	t.Run("RolledBack", func(t *testing.T) {
		tx := begin(t, s)
		must(t, tx.RecordLoss(ctx, outbox.Loss{Feed: "g", Reason: "x", Epoch: "e"}))
		must(t, tx.Rollback())
		equal(t, "lossless of g", feedStats(t, s, "g").Lossless, true)
		ls, err := s.Losses(ctx, "g")
		must(t, err)
		equal(t, "losses of g", len(ls), 0)
	})
}

func TestStore_AckLosses(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	record := func(from, to int64) {
		t.Helper()
		tx := begin(t, s)
		must(t, tx.RecordLoss(ctx, outbox.Loss{Feed: "f", Reason: "rotated", Epoch: "e", From: from, To: to}))
		must(t, tx.Commit())
	}
	ack := func() int64 {
		t.Helper()
		n, err := s.AckLosses(ctx, "f")
		must(t, err)
		return n
	}
	ackedAt := func() []int64 {
		t.Helper()
		ls, err := s.Losses(ctx, "f")
		must(t, err)
		var at []int64
		for _, l := range ls {
			at = append(at, l.AckedAt)
		}
		return at
	}

	t.Run("OK", func(t *testing.T) {
		equal(t, "acked with no losses", ack(), 0)
		record(0, 10)
		record(10, 20)
		equal(t, "lossless", feedStats(t, s, "f").Lossless, false)
		t1 := clk.Add(time.Second).UnixNano()
		equal(t, "acked", ack(), 2)
		equal(t, "lossless", feedStats(t, s, "f").Lossless, true)
		if got := ackedAt(); !slices.Equal(got, []int64{t1, t1}) {
			t.Fatalf("acked_at = %v, want [%d %d]", got, t1, t1)
		}

		// Acking again changes nothing.
		clk.Add(time.Second)
		equal(t, "acked again", ack(), 0)
		if got := ackedAt(); !slices.Equal(got, []int64{t1, t1}) {
			t.Fatalf("acked_at = %v, want [%d %d]", got, t1, t1)
		}

		// A new loss: only it is acked next.
		record(20, 30)
		equal(t, "lossless", feedStats(t, s, "f").Lossless, false)
		t2 := clk.Add(time.Second).UnixNano()
		equal(t, "acked", ack(), 1)
		if got := ackedAt(); !slices.Equal(got, []int64{t1, t1, t2}) {
			t.Fatalf("acked_at = %v, want [%d %d %d]", got, t1, t1, t2)
		}
		equal(t, "lossless", feedStats(t, s, "f").Lossless, true)
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		n, err := s.AckLosses(ctx, "nope")
		if !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("AckLosses(nope) = %d, %v; want ErrNotFound", n, err)
		}
		equal(t, "error", err.Error(), "feed nope: not found")
		equal(t, "acked", n, 0)
	})
}

func TestStore_SetLastError(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.SetLastError(ctx, "f", "disk on fire"))
	equal(t, "last error", feedStats(t, s, "f").LastError, "disk on fire")
	must(t, s.SetLastError(ctx, "f", ""))
	equal(t, "last error", feedStats(t, s, "f").LastError, "")
}

func deadLetter(t *testing.T, s *outbox.Store, d outbox.DeadLetter) int64 {
	t.Helper()
	tx := begin(t, s)
	id, err := tx.DeadLetter(context.Background(), d)
	must(t, err)
	must(t, tx.Commit())
	return id
}

func sameDeadLetter(t *testing.T, got, want outbox.DeadLetter) {
	t.Helper()
	if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
		t.Fatalf("dead letter:\n got %#v\nwant %#v", got, want)
	}
}

func TestTx_DeadLetter(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))

	t.Run("OK", func(t *testing.T) {
		hs := outbox.EncodeHeaders([]outbox.Header{{Key: "h", Value: []byte{0}}})
		d := outbox.DeadLetter{ID: 77, Feed: "f", Partition: 3, Epoch: "ep", Position: 1 << 40, Sequence: 12, Attempts: 4,
			Reason: "malformed", Error: "line 1:\n\tbad \x00 byte", Key: []byte{0, 0xff}, Payload: []byte("a,\xff\x00\n"),
			Headers: hs, At: 5, RequeuedAt: 6}
		id := deadLetter(t, s, d)
		equal(t, "id", id, 1)
		got, err := s.DeadLetterByID(ctx, "f", id)
		must(t, err)
		// ID and At are the store's; a new dead letter is not requeued.
		d.ID, d.At, d.RequeuedAt = 1, clk.Now().UnixNano(), 0
		if outboxtest.OnPostgres() {
			d.Error = `line 1:` + "\n\tbad " + `\x00 byte` // PostgreSQL's text holds no NUL
		}
		sameDeadLetter(t, got, d)
	})

	t.Run("NilKeyPayloadHeaders", func(t *testing.T) {
		id := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Reason: "r", Error: "e"})
		got, err := s.DeadLetterByID(ctx, "f", id)
		must(t, err)
		if got.Key != nil || got.Payload != nil || got.Headers != nil {
			t.Fatalf("dead letter = %#v, want nil key, payload and headers", got)
		}
	})

	t.Run("ErrUnknownFeed", func(t *testing.T) {
		tx := begin(t, s)
		_, err := tx.DeadLetter(ctx, outbox.DeadLetter{Feed: "nope", Epoch: "e", Position: 3})
		if err == nil || !strings.HasPrefix(err.Error(), "store dead letter of nope at 3: ") ||
			outbox.Classify(err) != outbox.ClassConstraint || !strings.Contains(err.Error(), foreignKeyFailed()) {
			t.Fatalf("DeadLetter of an unknown feed = %v", err)
		}
	})
}

func TestTx_MarkRequeued(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	id := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Reason: "r", Error: "e"})
	mark := func(feed string, id int64) bool {
		t.Helper()
		tx := begin(t, s)
		ok, err := tx.MarkRequeued(ctx, feed, id)
		must(t, err)
		must(t, tx.Commit())
		return ok
	}
	equal(t, "requeue of another feed's id", mark("g", id), false)
	equal(t, "requeue of an unknown id", mark("f", id+1), false)
	at := clk.Add(time.Second).UnixNano()
	equal(t, "first requeue", mark("f", id), true)
	clk.Add(time.Second)
	equal(t, "second requeue", mark("f", id), false)
	d, err := s.DeadLetterByID(ctx, "f", id)
	must(t, err)
	equal(t, "requeued_at", d.RequeuedAt, at)
}

func TestStore_DeadLetters(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	for i, feed := range []string{"f", "g", "f", "f", "g", "f"} { // f: 1 3 4 6, g: 2 5
		deadLetter(t, s, outbox.DeadLetter{Feed: feed, Epoch: "e", Position: int64(i + 1), Reason: "r", Error: "e"})
	}
	for _, c := range []struct {
		feed  string
		after int64
		limit int
		want  []int64
	}{
		{"f", 0, 10, []int64{1, 3, 4, 6}},
		{"f", 0, 2, []int64{1, 3}},
		{"f", 3, 2, []int64{4, 6}},
		{"f", 4, 2, []int64{6}},
		{"f", 6, 2, nil},
		{"g", 0, 10, []int64{2, 5}},
		{"g", 2, 10, []int64{5}},
		{"nope", 0, 10, nil},
		{"f", 0, 0, nil},
	} {
		ds, err := s.DeadLetters(ctx, c.feed, c.after, c.limit)
		must(t, err)
		var got []int64
		for _, d := range ds {
			got = append(got, d.ID)
			equal(t, "position", d.Position, d.ID)
			equal(t, "feed", d.Feed, c.feed)
		}
		if !slices.Equal(got, c.want) {
			t.Fatalf("DeadLetters(%q, %d, %d) ids = %v, want %v", c.feed, c.after, c.limit, got, c.want)
		}
	}
}

func TestStore_DeadLetterByID(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g"}))
	id := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Position: 9, Reason: "r", Error: "e"})

	t.Run("OK", func(t *testing.T) {
		d, err := s.DeadLetterByID(ctx, "f", id)
		must(t, err)
		equal(t, "position", d.Position, 9)
	})
	for _, c := range []struct {
		name, feed string
		id         int64
		err        string
	}{
		{"ErrNotFound", "f", id + 1, "dead letter 2 of f: not found"},
		{"ErrNotFoundOtherFeed", "g", id, "dead letter 1 of g: not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.DeadLetterByID(ctx, c.feed, c.id)
			if !errors.Is(err, outbox.ErrNotFound) {
				t.Fatalf("DeadLetterByID(%q, %d) = %v, want ErrNotFound", c.feed, c.id, err)
			}
			equal(t, "error", err.Error(), c.err)
		})
	}
}

// TestStore_RelayRowsMatchesRows: the relay's reader returns exactly what
// Rows does, whatever mix of feeds, epochs, topics and partitions a batch
// holds (the reader leaves out texts equal to the last batch's), with
// empty keys and values apart from null ones, several outputs an item,
// and read in batches of every size.
func TestStore_RelayRowsMatchesRows(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	feeds := []string{"a", "b", ""}
	topics := []string{"out", "out.dead", "other"}
	tx := begin(t, s)
	for i := range 60 {
		p := outbox.Place{Feed: feeds[(i/3)%3], Partition: int32(i % 4 * 1000), Epoch: fmt.Sprint("ep", i/7),
			Position: int64(i + 1)}
		must(t, tx.BeginItem(p))
		for n := range 1 + i%3 {
			o := outbox.Output{Topic: topics[(i+n)%len(topics)], Value: []byte(fmt.Sprint("v", i, n))}
			switch (i + n) % 5 {
			case 0:
				o.Key = []byte(fmt.Sprint("k", i))
			case 1:
				o.Key, o.Value = []byte{}, []byte{}
			case 2:
				o.Value = nil
			case 3:
				o.Headers = []outbox.Header{{Key: "h", Value: []byte(fmt.Sprint(i))}}
			}
			must(t, tx.Emit(ctx, o))
		}
		must(t, tx.EndItem())
	}
	must(t, tx.Commit())
	all, err := s.Rows(ctx, 0, 1000)
	must(t, err)
	equal(t, "rows", len(all), 120)
	for _, limit := range []int{1, 2, 5, 7, 64, 1000} {
		var got []outbox.Row
		for after := int64(0); ; {
			rows, err := s.RelayRows(ctx, after, limit)
			must(t, err)
			if len(rows) == 0 {
				break
			}
			got = append(got, rows...)
			after = rows[len(rows)-1].ID
		}
		if !reflect.DeepEqual(got, all) {
			for i := range min(len(got), len(all)) {
				if !reflect.DeepEqual(got[i], all[i]) {
					t.Fatalf("limit %d: row %d is\n %+v\nwant %+v", limit, i, got[i], all[i])
				}
			}
			t.Fatalf("limit %d: %d rows, want %d", limit, len(got), len(all))
		}
	}
}

// foreignKeyFailed is what the store's engine says of a row whose foreign
// key names no row.
func foreignKeyFailed() string {
	if outboxtest.OnPostgres() {
		return "violates foreign key constraint"
	}
	return "FOREIGN KEY constraint failed"
}
