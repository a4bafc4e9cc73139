package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// stallConfig retries a stalled feed every few milliseconds.
func stallConfig() ingest.Config {
	cfg := testConfig()
	cfg.StallMaxDelay = 20 * time.Millisecond
	return cfg
}

// batchSizes records the size of every committed batch.
type batchSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) observe(records int, _ time.Duration) {
	b.mu.Lock()
	b.sizes = append(b.sizes, records)
	b.mu.Unlock()
}

func (b *batchSizes) get() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sizes)
}

// setMaxPages caps (or, with a large n, uncaps) the database's size in
// pages: past it SQLite fails writes with SQLITE_FULL, as on a full disk.
// It returns the pages in use.
func setMaxPages(t *testing.T, s *outbox.Store, n int) int {
	t.Helper()
	var pages int
	if err := outboxtest.Get(context.Background(), s, &pages, "PRAGMA page_count"); err != nil {
		t.Fatal(err)
	}
	if n < 0 {
		n = pages
	}
	if _, err := outboxtest.Exec(context.Background(), s, fmt.Sprintf("PRAGMA max_page_count = %d", n)); err != nil {
		t.Fatal(err)
	}
	return pages
}

func lossesOf(t *testing.T, s *outbox.Store) []outbox.Loss {
	t.Helper()
	ls, err := s.Losses(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// A full database stalls the feed at once, with the reason, and the feed
// resumes by itself once there is room: every item applied once.
func TestLoop_StallOnFullDatabase(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a")
	l, stop := running(t, s, f, newCounter(), stallConfig())
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
	setMaxPages(t, s, -1)
	big := make([]string, 20)
	for i := range big {
		big[i] = fmt.Sprintf("%02d", i) + strings.Repeat("x", 8<<10) // each needs pages of its own
	}
	f.append("e1", big...)
	wait(t, 5*time.Second, func() error {
		st, e := l.State()
		if st != outbox.StateStalled || !strings.HasPrefix(e, "completion failure: disk full: ") {
			return fmt.Errorf("state %s (%q), want stalled on a full disk", st, e)
		}
		return nil
	})
	if err := s.CheckWritable(context.Background()); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("CheckWritable while the database is full = %v", err)
	}
	if err := positionIs(s, "f", "e1", 1)(); err != nil {
		t.Fatal(err)
	}

	setMaxPages(t, s, 1<<30) // room again
	wait(t, 10*time.Second, positionIs(s, "f", "e1", 21))
	wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"a": 1}
	for _, v := range big {
		want[v] = 1
	}
	if got := counts(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: %d values, want %d, each once", len(got), len(want))
	}
	rows := outboxRows(t, s)
	equal(t, "outbox rows", len(rows), 21)
	for i, r := range rows {
		if r.Position != int64(i+1) {
			t.Fatalf("row %d at position %d, want %d", i, r.Position, i+1)
		}
	}
	st := stats(t, s)
	equal(t, "applied", st.Applied, 21)
	equal(t, "completionFailures", st.CompletionFailures, 0)
	equal(t, "lossless", st.Lossless, true)
	equal(t, "stored lastError", st.LastError, "")
}

// poisoned is a counter whose item "poison" can never commit: its
// transaction fails at COMMIT, wherever the item is in it.
type poisoned struct{ *counter }

func (p poisoned) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if string(item.Value) == "poison" {
		tx.BeforeCommit(func(context.Context) error { return errors.New("poison cannot commit") })
	}
	return p.counter.Apply(ctx, tx, d, item)
}

// Under skip, a batch that cannot commit is tried in halves until the one
// item that cannot commit is alone; only it is skipped, its exact range a
// loss.
func TestLoop_SkipInPieces(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a", "b", "c", "d", "poison", "f", "g", "h")
	var sizes batchSizes
	cfg := stallConfig()
	cfg.OnCompletionFailure = ingest.OnCompletionSkip
	cfg.BatchWait = time.Second // the eight items in one batch
	cfg.OnBatch = sizes.observe
	_, stop := running(t, s, f, poisoned{newCounter()}, cfg)
	wait(t, 10*time.Second, positionIs(s, "f", "e1", 8))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The epoch; the first half; the skip of poison; the rest.
	if got, want := sizes.get(), []int{1, 4, 1, 3}; !slices.Equal(got, want) {
		t.Fatalf("committed batches of %v records, want %v", got, want)
	}
	want := map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "f": 1, "g": 1, "h": 1}
	if got := counts(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
	var rows []rowPlace
	for i, v := range []string{"a", "b", "c", "d", "", "f", "g", "h"} {
		if v != "" {
			rows = append(rows, rowPlace{"out", "e1", int64(i + 1), 0, v})
		}
	}
	if got := outboxRows(t, s); !reflect.DeepEqual(got, rows) {
		t.Fatalf("outbox = %v, want %v", got, rows)
	}
	ls := lossesOf(t, s)
	if len(ls) != 1 || ls[0].From != 4 || ls[0].To != 5 || ls[0].Epoch != "e1" ||
		ls[0].Reason != "completion failure skipped: commit: poison cannot commit" {
		t.Fatalf("losses %+v, want the one of poison, 4..5", ls)
	}
	st := stats(t, s)
	equal(t, "applied", st.Applied, 7)
	equal(t, "completionFailures", st.CompletionFailures, 1)
	equal(t, "lossless", st.Lossless, false)
}

// When the skip cannot commit either (it needs the store too), the feed
// stalls instead, saying so, and once the store is back the item itself
// commits: nothing is lost.
func TestLoop_SkipNeedsTheStoreToo(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a")
	cfg := stallConfig()
	cfg.OnCompletionFailure = ingest.OnCompletionSkip
	// The store comes back while the feed waits out its stall, never
	// between an item's failed commit and the commit of its skip (which
	// would then rightly skip it): the stall is logged right before the
	// wait, after the skip failed.
	var loop atomic.Pointer[ingest.Loop]
	var stalledState outbox.FeedState
	var stalledErr string
	var healed <-chan struct{}
	cfg.Logger, healed = healOnStall(s, func() { stalledState, stalledErr = loop.Load().State() })
	l, stop := running(t, s, f, newCounter(), cfg)
	loop.Store(l)
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
	failCommits(s, 1<<30)
	f.append("e1", "b", "c")
	wait(t, 5*time.Second, func() error {
		select {
		case <-healed:
			return nil
		default:
			return errors.New("the feed has not stalled")
		}
	})
	if stalledState != outbox.StateStalled || !strings.Contains(stalledErr, "skipping the record needs the database (and its disk) too") {
		t.Fatalf("state %s (%q), want stalled, the skip failing too", stalledState, stalledErr)
	}
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
	wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := counts(t, s), map[string]int{"a": 1, "b": 1, "c": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
	want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"out", "e1", 2, 0, "b"}, {"out", "e1", 3, 0, "c"}}
	if got := outboxRows(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("outbox = %v, want %v", got, want)
	}
	equal(t, "losses", len(lossesOf(t, s)), 0)
	st := stats(t, s)
	equal(t, "completionFailures", st.CompletionFailures, 0)
	equal(t, "lossless", st.Lossless, true)
}

// Under skip, once the record that could not commit alone (nor be skipped)
// commits after the stall, the rest of the batch goes whole again, not a
// record at a time: nothing is lost, and it takes one transaction.
func TestLoop_SkipResumesWhole(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a")
	var sizes batchSizes
	cfg := stallConfig()
	cfg.OnCompletionFailure = ingest.OnCompletionSkip
	cfg.BatchWait = time.Second // the sixteen items in one batch
	cfg.OnBatch = sizes.observe
	// As in TestLoop_SkipNeedsTheStoreToo, the store comes back while the
	// feed waits out its stall.
	healedAt := -1
	var healed <-chan struct{}
	cfg.Logger, healed = healOnStall(s, func() { healedAt = len(sizes.get()) })
	l, stop := running(t, s, f, newCounter(), cfg)
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
	failCommits(s, 1<<30)
	items := make([]string, 16)
	for i := range items {
		items[i] = fmt.Sprintf("v%02d", i)
	}
	f.append("e1", items...)
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 17))
	wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	<-healed
	// The record that ended the stall, then the other fifteen at once.
	if got, want := sizes.get()[healedAt:], []int{1, 15}; !slices.Equal(got, want) {
		t.Fatalf("committed after the stall: batches of %v records, want %v", got, want)
	}
	want := map[string]int{"a": 1}
	for _, v := range items {
		want[v] = 1
	}
	if got := counts(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
	rows := outboxRows(t, s)
	equal(t, "outbox rows", len(rows), 17)
	for i, r := range rows {
		if r.Position != int64(i+1) {
			t.Fatalf("row %d at position %d, want %d", i, r.Position, i+1)
		}
	}
	equal(t, "losses", len(lossesOf(t, s)), 0)
	st := stats(t, s)
	equal(t, "applied", st.Applied, 17)
	equal(t, "completionFailures", st.CompletionFailures, 0)
	equal(t, "lossless", st.Lossless, true)
}

// healOnStall returns a logger that, at the feed's first "feed stalled"
// log (right before the stall's wait), calls at, lets s commit again and
// closes the channel it returns.
func healOnStall(s *outbox.Store, at func()) (*slog.Logger, <-chan struct{}) {
	healed := make(chan struct{})
	var once sync.Once
	return slog.New(logHook(func(msg string) {
		if !strings.HasPrefix(msg, "feed stalled") {
			return
		}
		once.Do(func() {
			at()
			s.SetCommitHook(nil)
			close(healed)
		})
	})), healed
}

// uniqueCounter is a counter that also writes each value into a table
// where it must be unique: in Apply, or at COMMIT.
type uniqueCounter struct {
	*counter
	atCommit bool
}

func (p uniqueCounter) Setup(ctx context.Context, tx *outbox.Tx) error {
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS uniq (v TEXT PRIMARY KEY)`); err != nil {
		return err
	}
	return p.counter.Setup(ctx, tx)
}

func (p uniqueCounter) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if err := p.counter.Apply(ctx, tx, d, item); err != nil {
		return err
	}
	insert := func(ctx context.Context) error {
		_, err := tx.Exec(ctx, `INSERT INTO uniq VALUES (?)`, string(item.Value))
		return err
	}
	if p.atCommit {
		tx.BeforeCommit(insert)
		return nil
	}
	return insert(ctx)
}

// A broken constraint is the item's fault: it is dead-lettered, not retried,
// and the items around it are applied.
func TestLoop_Constraint(t *testing.T) {
	for _, tc := range []struct {
		name     string
		atCommit bool
		batches  []int
	}{
		// In Apply: the item's savepoint is undone and it is dead-lettered
		// in the same transaction.
		{"InApply", false, []int{1, 5}},
		// At COMMIT: halves until the item is alone, then its dead letter.
		{"AtCommit", true, []int{1, 2, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := outboxtest.TempStore(t)
			f := newMemFeed("e1", "a", "b", "c", "b", "d")
			var sizes batchSizes
			cfg := stallConfig()
			cfg.BatchWait = time.Second
			cfg.OnBatch = sizes.observe
			p := uniqueCounter{newCounter(), tc.atCommit}
			_, stop := running(t, s, f, p, cfg)
			wait(t, 10*time.Second, positionIs(s, "f", "e1", 5))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := sizes.get(); !slices.Equal(got, tc.batches) {
				t.Fatalf("committed batches of %v records, want %v", got, tc.batches)
			}
			if got, want := counts(t, s), map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}; !reflect.DeepEqual(got, want) {
				t.Fatalf("counts = %v, want %v", got, want)
			}
			dls, err := s.DeadLetters(context.Background(), "f", 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(dls) != 1 || dls[0].Position != 4 || dls[0].Reason != ingest.ReasonConstraint || dls[0].Attempts != 1 ||
				!strings.Contains(dls[0].Error, "UNIQUE constraint failed: uniq.v") {
				t.Fatalf("dead letters %+v, want the second b, at 4, for its constraint", dls)
			}
			p.mu.Lock()
			tries := p.attempts["b"]
			p.mu.Unlock()
			if tc.atCommit {
				// b at 2 in the whole batch and its first half; b at 4 in the
				// whole, in [c b] and alone.
				equal(t, "tries of the two b", len(tries), 5)
			} else {
				equal(t, "tries of the two b", len(tries), 2) // once each: no retry
			}
			st := stats(t, s)
			equal(t, "applied", st.Applied, 4)
			equal(t, "deadLettered", st.DeadLettered, 1)
			equal(t, "retries", st.Retries, 0)
			equal(t, "lossless", st.Lossless, true)
		})
	}
}

// closeCounter is a feed that counts its Close calls and can fail its Open.
type closeCounter struct {
	*memFeed
	openErr error
	closes  atomic.Int32
}

func (f *closeCounter) Open(ctx context.Context, from map[int32]outbox.Checkpoint) error {
	if f.openErr != nil {
		return f.openErr
	}
	return f.memFeed.Open(ctx, from)
}

func (f *closeCounter) Close() error { f.closes.Add(1); return nil }

type failingSetup struct{ *counter }

func (failingSetup) Setup(context.Context, *outbox.Tx) error { return errors.New("no table for you") }

// A feed that cannot go on says so: Run returns the error, the state is
// failed with it, and the feed is closed.
func TestLoop_Fails(t *testing.T) {
	t.Run("OpenFails", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := &closeCounter{memFeed: newMemFeed("e1"), openErr: errors.New("source unreadable")}
		l, err := ingest.NewLoop(s, f, newCounter(), testConfig())
		if err != nil {
			t.Fatal(err)
		}
		err = l.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), "source unreadable") {
			t.Fatalf("Run = %v, want the open error", err)
		}
		if err := stateIs(l, outbox.StateFailed, err.Error())(); err != nil {
			t.Fatal(err)
		}
		equal(t, "closes", f.closes.Load(), int32(1))
	})

	t.Run("SetupFails", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := &closeCounter{memFeed: newMemFeed("e1")}
		l, _ := ingest.NewLoop(s, f, failingSetup{newCounter()}, testConfig())
		err := l.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), "set up processor of f: no table for you") {
			t.Fatalf("Run = %v, want the setup error", err)
		}
		if err := stateIs(l, outbox.StateFailed, err.Error())(); err != nil {
			t.Fatal(err)
		}
		equal(t, "closes", f.closes.Load(), int32(1))
	})

	t.Run("FileFeedOpenFailsNoLeak", func(t *testing.T) {
		// A real file feed whose Open has started its watcher, then fails
		// (a read error on resume, say): the loop must close it.
		s := outboxtest.TempStore(t)
		before := runtime.NumGoroutine()
		feed := &failingOpen{Feed: filefeed.New(filepath.Join(t.TempDir(), "in.log"), filefeed.Options{})}
		l, _ := ingest.NewLoop(s, feed, newCounter(), testConfig())
		if err := l.Run(context.Background()); err == nil || !feed.opened {
			t.Fatalf("Run of a feed whose Open fails = %v (opened %v), want its error", err, feed.opened)
		}
		// The feed's watcher goroutine is gone with the feed.
		wait(t, 5*time.Second, func() error {
			if n := runtime.NumGoroutine(); n > before {
				return fmt.Errorf("%d goroutines, %d before Run", n, before)
			}
			return nil
		})
		if st, _ := l.State(); st != outbox.StateFailed {
			t.Fatalf("state %s, want failed", st)
		}
	})

	t.Run("Fenced", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		if _, err := s.Claim(context.Background()); err != nil {
			t.Fatal(err)
		}
		other, err := outbox.Open(context.Background(), outbox.DefaultConfig(s.Path()))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		f := newMemFeed("e1", "a")
		l, err := ingest.NewLoop(s, f, newCounter(), testConfig())
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- l.Run(context.Background()) }()
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
		if _, err := other.Claim(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.append("e1", "b")
		var runErr error
		select {
		case runErr = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run goes on after another process claimed the database")
		}
		if !errors.Is(runErr, outbox.ErrFenced) {
			t.Fatalf("Run = %v, want ErrFenced", runErr)
		}
		if err := stateIs(l, outbox.StateFailed, runErr.Error())(); err != nil {
			t.Fatal(err)
		}
		if err := positionIs(s, "f", "e1", 1)(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ShutdownWhileStalledIsClean", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := preparedCounter(t, s)
		failCommits(s, 1<<30)
		l, stop := running(t, s, newMemFeed("e1", "a"), p, stallConfig())
		wait(t, 5*time.Second, func() error {
			if st, _ := l.State(); st != outbox.StateStalled {
				return fmt.Errorf("state %s, want stalled", st)
			}
			return nil
		})
		if err := stop(); err != nil {
			t.Fatalf("Run after a shutdown while stalled = %v, want nil", err)
		}
		if st, _ := l.State(); st != outbox.StateStopped {
			t.Fatalf("state %s after shutdown, want stopped", st)
		}
	})
}

// waitingFeed is a memFeed whose source can be absent.
type waitingFeed struct {
	*memFeed
	why atomic.Value // string
}

func (f *waitingFeed) Waiting() string { return f.why.Load().(string) }

// While the feed's source is absent and nothing else is wrong, the state
// is waiting with the reason; a stall says stalled whatever the source.
func TestLoop_Waiting(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := &waitingFeed{memFeed: newMemFeed("e1")}
	const why = "waiting for /data/in.csv to be created"
	f.why.Store(why)
	l, stop := running(t, s, f, newCounter(), stallConfig())
	wait(t, 5*time.Second, stateIs(l, outbox.StateWaiting, why))
	f.why.Store("")
	f.append("e1", "a")
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
	wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))

	f.why.Store(why)
	failCommits(s, 1<<30)
	f.append("e1", "b")
	wait(t, 5*time.Second, func() error {
		if st, _ := l.State(); st != outbox.StateStalled {
			return fmt.Errorf("state %s, want stalled (a stall outranks waiting)", st)
		}
		return nil
	})
	s.SetCommitHook(nil)
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 2))
	wait(t, 5*time.Second, stateIs(l, outbox.StateWaiting, why))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A stall holds no lock between its tries: a requeue is answered at once
// (here with the store's error, since its commit fails too).
func TestLoop_RequeueWhileStalled(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "down")
	p := newCounter()
	p.fail["down"] = 3  // every try: a dead letter, which a requeue applies
	cfg := testConfig() // stall waits of a second and more
	l, stop := running(t, s, f, p, cfg)
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
	dls, err := s.DeadLetters(context.Background(), "f", 0, 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %v, %v: want one", dls, err)
	}
	failCommits(s, 1<<30)
	f.append("e1", "a")
	wait(t, 5*time.Second, func() error {
		if st, _ := l.State(); st != outbox.StateStalled {
			return fmt.Errorf("state %s, want stalled", st)
		}
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := l.Requeue(context.Background(), dls[0].ID)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "injected commit failure") {
			t.Fatalf("Requeue while stalled = %v, want the commit's failure", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Requeue waits behind a stalled feed")
	}
	s.SetCommitHook(nil)
	wait(t, 10*time.Second, positionIs(s, "f", "e1", 2))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// failingOpen is a real feed whose Open succeeds, watcher and all, and then
// reports a failure.
type failingOpen struct {
	*filefeed.Feed
	opened bool
}

func (f *failingOpen) Open(ctx context.Context, from map[int32]outbox.Checkpoint) error {
	if err := f.Feed.Open(ctx, from); err != nil {
		return err
	}
	f.opened = true
	return errors.New("open: a read error after the watcher started")
}

// logHook is a slog handler that hands each record's message to f, in the
// goroutine that logs it.
type logHook func(msg string)

func (h logHook) Enabled(context.Context, slog.Level) bool { return true }

func (h logHook) Handle(_ context.Context, r slog.Record) error {
	h(r.Message)
	return nil
}

func (h logHook) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h logHook) WithGroup(string) slog.Handler { return h }

// slowOpen is a feed whose Open waits for release, and whose ends say 0
// until it is open, as a file feed's do before it has looked at the file.
type slowOpen struct {
	*memFeed
	release chan struct{}
	open    atomic.Bool
}

func (f *slowOpen) Open(ctx context.Context, from map[int32]outbox.Checkpoint) error {
	select {
	case <-f.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := f.memFeed.Open(ctx, from); err != nil {
		return err
	}
	f.open.Store(true)
	return nil
}

func (f *slowOpen) Ends() map[int32]int64 {
	if !f.open.Load() {
		return map[int32]int64{0: 0}
	}
	return f.memFeed.Ends()
}

// A feed being opened runs, and is not caught up: its ends are not the
// source's yet, so nothing says the committed positions reach them.
func TestLoop_NotCaughtUpWhileOpening(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := &slowOpen{memFeed: newMemFeed("e1", "a", "b"), release: make(chan struct{})}
	l, stop := running(t, s, f, newCounter(), testConfig())
	// Stopped until the loop starts, then running: with the ends at 0 and
	// nothing committed, a caught-up here would be the lie.
	wait(t, 5*time.Second, stateIs(l, outbox.StateRunning, ""))
	for range 20 { // Open still waits for release: the state holds
		if st, e := l.State(); st != outbox.StateRunning || e != "" {
			t.Fatalf("state %s (%q) while the feed opens, want running", st, e)
		}
		runtime.Gosched()
	}
	close(f.release)
	wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
	if err := positionIs(s, "f", "e1", 2)(); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := counts(t, s), map[string]int{"a": 1, "b": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
}

// Under skip, a full disk is never skipped: a skip would drop items for a
// cause that freeing space removes (and on a real disk the skip needs the
// space too). The feed stalls as under stop, saying why, nothing counted
// and nothing lost, and resumes by itself once there is room.
func TestLoop_SkipWaitsOnFullDatabase(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a")
	cfg := stallConfig()
	cfg.OnCompletionFailure = ingest.OnCompletionSkip
	l, stop := running(t, s, f, newCounter(), cfg)
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
	setMaxPages(t, s, -1)
	big := make([]string, 20)
	for i := range big {
		// Each needs pages of its own; a skip's loss and position fit the
		// pages the database has.
		big[i] = fmt.Sprintf("%02d", i) + strings.Repeat("x", 8<<10)
	}
	f.append("e1", big...)
	wait(t, 5*time.Second, func() error {
		st, e := l.State()
		if st != outbox.StateStalled || !strings.HasPrefix(e, "completion failure: disk full: ") ||
			!strings.Contains(e, "skip never skips for a full disk: it waits for space") {
			return fmt.Errorf("state %s (%q), want stalled on a full disk, not skipping", st, e)
		}
		return nil
	})
	time.Sleep(50 * time.Millisecond) // several of the stall's tries (stallConfig: a few ms apart)
	if err := positionIs(s, "f", "e1", 1)(); err != nil {
		t.Fatal(err)
	}
	equal(t, "losses while full", len(lossesOf(t, s)), 0)
	equal(t, "completionFailures while full", stats(t, s).CompletionFailures, 0)

	setMaxPages(t, s, 1<<30) // room again
	wait(t, 10*time.Second, positionIs(s, "f", "e1", 21))
	wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"a": 1}
	for _, v := range big {
		want[v] = 1
	}
	if got := counts(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: %d values, want %d, each once", len(got), len(want))
	}
	equal(t, "losses", len(lossesOf(t, s)), 0)
	st := stats(t, s)
	equal(t, "applied", st.Applied, 21)
	equal(t, "completionFailures", st.CompletionFailures, 0)
	equal(t, "lossless", st.Lossless, true)
}
