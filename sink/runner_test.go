package sink_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
	"github.com/outboxd/outboxd/sink"
)

// memTarget is a real in-process target: it holds what it is given, and
// fails at random like a remote system would. A failed Deliver makes a
// random prefix of its rows durable (an ack lost), a failed Resume holds
// nothing back.
type memTarget struct {
	mu      sync.Mutex
	held    []outbox.Row
	seen    map[int64]int // deliveries of each id
	rng     *rand.Rand
	failDel float64 // chance a Deliver fails
	failRes float64 // chance a Resume fails
	// exactly says Resume reports what it holds (an exactly-once target);
	// false: it reports 0 (at-least-once, the store's progress counts).
	exactly bool
	resumes int
	closed  bool
}

func newMemTarget(seed uint64, failDel, failRes float64, exactly bool) *memTarget {
	return &memTarget{seen: map[int64]int{}, rng: rand.New(rand.NewPCG(seed, seed+1)),
		failDel: failDel, failRes: failRes, exactly: exactly}
}

var errFlaky = errors.New("flaky target")

func (m *memTarget) Resume(ctx context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.resumes++
	if m.rng.Float64() < m.failRes {
		return 0, errFlaky
	}
	if !m.exactly || len(m.held) == 0 {
		return 0, nil
	}
	return m.held[len(m.held)-1].ID, nil
}

// Screen refuses values starting "screen-bad" before delivery.
func (m *memTarget) Screen(rows []outbox.Row) ([]outbox.Row, []outbox.RowDeadLetter) {
	var keep []outbox.Row
	var bad []outbox.RowDeadLetter
	for _, r := range rows {
		if strings.HasPrefix(string(r.Value), "screen-bad") {
			bad = append(bad, outbox.RowDeadLetter{Row: r, Reason: "test-screened", Error: "screened out"})
			continue
		}
		keep = append(keep, r)
	}
	return keep, bad
}

func (m *memTarget) Deliver(ctx context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(rows)
	var err error
	if m.rng.Float64() < m.failDel {
		n, err = m.rng.IntN(len(rows)+1), errFlaky
	}
	var dls []outbox.RowDeadLetter
	for _, r := range rows[:n] {
		if len(m.held) > 0 && r.ID <= m.held[len(m.held)-1].ID && m.exactly {
			return nil, fmt.Errorf("row %d delivered after %d", r.ID, m.held[len(m.held)-1].ID)
		}
		if strings.HasPrefix(string(r.Value), "deliver-bad") {
			dls = append(dls, outbox.RowDeadLetter{Row: r, Reason: "test-refused", Error: "refused"})
			continue
		}
		r.Key, r.Value = slices.Clone(r.Key), slices.Clone(r.Value)
		m.held = append(m.held, r)
		m.seen[r.ID]++
	}
	if err != nil {
		return nil, err
	}
	return dls, nil
}

func (m *memTarget) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

func (m *memTarget) snapshot() ([]outbox.Row, map[int64]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := make(map[int64]int, len(m.seen))
	for k, v := range m.seen {
		seen[k] = v
	}
	return slices.Clone(m.held), seen
}

// emit writes one commit of outputs: value i of topics[i%len(topics)].
func emit(t *testing.T, s *outbox.Store, from, n int, topics []string, value func(i int) string) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	testutil.Must(t, err)
	defer tx.Rollback()
	for i := from; i < from+n; i++ {
		testutil.Must(t, tx.BeginItem(outbox.Place{Feed: "f", Epoch: "e", Position: int64(i + 1)}))
		o := outbox.Output{Topic: topics[i%len(topics)], Key: []byte(fmt.Sprint("k", i%7)), Value: []byte(value(i))}
		testutil.Must(t, tx.Emit(ctx, o))
		testutil.Must(t, tx.EndItem())
	}
	testutil.Must(t, tx.Commit())
}

func spec(name string, topics ...string) sink.Spec {
	s := sink.Spec{Name: name, URL: &url.URL{Scheme: "mem", Host: "x"}, Topics: map[string]sink.TopicMap{}, Logger: slog.New(slog.DiscardHandler)}
	for _, t := range topics {
		s.Topics[t] = sink.TopicMap{}
	}
	return s
}

func fastConfig() sink.Config {
	return sink.Config{Batch: 64, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, ProgressEvery: time.Millisecond}
}

// start runs r until the test ends (or stop is called) and returns stop.
func start(t *testing.T, r *sink.Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitDelivered waits until the sink's progress is stored through id.
func waitDelivered(t *testing.T, s *outbox.Store, r *sink.Runner, id int64) {
	t.Helper()
	testutil.Wait(t, 20*time.Second, func() error {
		st := r.Status()
		got, err := s.SinkProgress(context.Background(), r.Name())
		if err != nil {
			return err
		}
		if got != id || st.Delivered != id {
			return fmt.Errorf("stored progress %d, delivered %d, want %d (status %+v)", got, st.Delivered, id, st)
		}
		return nil
	})
}

// TestRunner_ThroughRandomFailures: a target that fails half its
// deliveries after a random prefix and a fifth of its resumes ends up
// with every row of its topics (exactly once when it reports what it
// holds, at least once otherwise), in id order, the refused rows stored
// as dead letters and nothing of the other topic. An exactly-once target
// refuses rows by screening them before delivery (see sink.Screener); an
// at-least-once one may refuse them in Deliver, as the rows after the
// stored progress come again after a failure.
func TestRunner_ThroughRandomFailures(t *testing.T) {
	for _, exactly := range []bool{true, false} {
		t.Run(map[bool]string{true: "ExactlyOnce", false: "AtLeastOnce"}[exactly], func(t *testing.T) {
			testThroughRandomFailures(t, exactly)
		})
	}
}

func testThroughRandomFailures(t *testing.T, exactly bool) {
	s := outboxtest.TempStore(t)
	ctx := context.Background()
	topics := []string{"a", "b", "c"}
	value := func(i int) string {
		switch {
		case i%97 == 0:
			return fmt.Sprint("screen-bad-", i)
		case i%89 == 0 && !exactly:
			return fmt.Sprint("deliver-bad-", i)
		}
		return fmt.Sprint("v", i)
	}
	tg := newMemTarget(1, 0.5, 0.2, exactly)
	r, err := sink.NewRunner(s, spec("mem", "a", "b"), tg, fastConfig())
	testutil.Must(t, err)
	start(t, r)
	const commits, per = 30, 100
	for c := range commits {
		emit(t, s, c*per, per, topics, value) // while the runner delivers
	}
	last, err := s.LastOutboxID(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "last id", last, int64(commits*per))
	waitDelivered(t, s, r, last)

	held, seen := tg.snapshot()
	var want []string
	wantDead := map[int64]string{}
	for i := range commits * per {
		id := int64(i + 1)
		if topics[i%3] == "c" {
			continue
		}
		switch v := value(i); {
		case strings.HasPrefix(v, "screen-bad"):
			wantDead[id] = "test-screened"
		case strings.HasPrefix(v, "deliver-bad"):
			wantDead[id] = "test-refused"
		default:
			want = append(want, fmt.Sprintf("%d:%s:%s", id, topics[i%3], v))
		}
	}
	var got []string
	dups := 0
	for _, row := range held {
		if exactly && seen[row.ID] != 1 {
			t.Errorf("row %d delivered %d times", row.ID, seen[row.ID])
		}
		if n := len(got); n > 0 && got[n-1] == fmt.Sprintf("%d:%s:%s", row.ID, row.Topic, row.Value) {
			continue
		}
		if n := len(got); n > 0 && !exactly && row.ID <= parseID(got[n-1]) {
			dups++ // a delivery again from the stored progress
			continue
		}
		got = append(got, fmt.Sprintf("%d:%s:%s", row.ID, row.Topic, row.Value))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("target holds %d distinct rows, want %d\n got %.300v\nwant %.300v", len(got), len(want), got, want)
	}
	dls, err := s.DeadLetters(ctx, "f", 0, 1000)
	testutil.Must(t, err)
	gotDead := map[int64]string{}
	for _, d := range dls {
		if d.OutboxID == nil {
			t.Fatalf("dead letter without outbox id: %+v", d)
		}
		gotDead[*d.OutboxID] = d.Reason
	}
	if fmt.Sprint(gotDead) != fmt.Sprint(wantDead) {
		t.Fatalf("dead letters %v, want %v", gotDead, wantDead)
	}
	st := r.Status()
	if exactly {
		testutil.Equal(t, "delivered total", st.DeliveredTotal, int64(len(want)))
	} else if st.DeliveredTotal < int64(len(want)) {
		t.Errorf("delivered total %d, want at least %d", st.DeliveredTotal, len(want))
	}
	testutil.Equal(t, "lag rows", st.LagRows, int64(0))
	if st.Errors == 0 {
		t.Errorf("no error counted through %d resumes", tg.resumes)
	}
	t.Logf("%d rows, %d delivered again, %d errors, %d resumes", len(want), dups, st.Errors, tg.resumes)
}

func parseID(s string) int64 {
	var id int64
	fmt.Sscanf(s, "%d:", &id)
	return id
}

// TestRunner_AtLeastOnceResumesAfterStoredProgress: a target that cannot
// tell what it holds gets, after a restart, exactly the rows after the
// stored progress.
func TestRunner_AtLeastOnceResumesAfterStoredProgress(t *testing.T) {
	s := outboxtest.TempStore(t)
	v := func(i int) string { return fmt.Sprint("v", i) }
	emit(t, s, 0, 100, []string{"a"}, v)
	tg := newMemTarget(2, 0, 0, false)
	r, err := sink.NewRunner(s, spec("hook", "a"), tg, fastConfig())
	testutil.Must(t, err)
	stop := start(t, r)
	waitDelivered(t, s, r, 100)
	stop()
	testutil.Must(t, r.Close())
	if !tg.closed {
		t.Fatal("Close did not close the target")
	}

	emit(t, s, 100, 50, []string{"a"}, v)
	tg2 := newMemTarget(3, 0, 0, false)
	r2, err := sink.NewRunner(s, spec("hook", "a"), tg2, fastConfig())
	testutil.Must(t, err)
	start(t, r2)
	waitDelivered(t, s, r2, 150)
	held, _ := tg2.snapshot()
	testutil.Equal(t, "rows after restart", len(held), 50)
	testutil.Equal(t, "first id", held[0].ID, int64(101))
	testutil.Equal(t, "last id", held[49].ID, int64(150))
}

// TestRunner_PassesOverOtherTopics: a sink none of whose topics are
// written still stores its progress through every row (pruning waits
// for it), and delivers nothing.
func TestRunner_PassesOverOtherTopics(t *testing.T) {
	s := outboxtest.TempStore(t)
	emit(t, s, 0, 300, []string{"x", "y"}, func(i int) string { return "v" })
	tg := newMemTarget(4, 0, 0, true)
	r, err := sink.NewRunner(s, spec("other", "z"), tg, fastConfig())
	testutil.Must(t, err)
	start(t, r)
	waitDelivered(t, s, r, 300)
	held, _ := tg.snapshot()
	testutil.Equal(t, "rows delivered", len(held), 0)
}

// TestRunner_WokenByCommit: an idle runner delivers a new commit's rows
// without waiting for its poll (an hour here).
func TestRunner_WokenByCommit(t *testing.T) {
	s := outboxtest.TempStore(t)
	cfg := fastConfig()
	cfg.Poll = time.Hour
	tg := newMemTarget(5, 0, 0, true)
	r, err := sink.NewRunner(s, spec("wake", "a"), tg, cfg)
	testutil.Must(t, err)
	start(t, r)
	testutil.Wait(t, 10*time.Second, func() error {
		if st := r.Status(); st.State != sink.StateIdle {
			return fmt.Errorf("state %s", st.State)
		}
		return nil
	})
	emit(t, s, 0, 3, []string{"a"}, func(i int) string { return "v" })
	waitDelivered(t, s, r, 3)
	testutil.Equal(t, "lag", r.Status().LagRows, int64(0))
}

// TestRunner_LagCountsTheSinksBacklog: a sink whose target is down shows
// the rows and bytes after its progress, and the failure.
func TestRunner_LagCountsTheSinksBacklog(t *testing.T) {
	s := outboxtest.TempStore(t)
	rng := rand.New(rand.NewPCG(6, 6))
	emit(t, s, 0, 40, []string{"a"}, func(i int) string { // random: the store compresses repeats
		b := make([]byte, 100)
		for j := range b {
			b[j] = byte(33 + rng.IntN(90))
		}
		return string(b)
	})
	tg := newMemTarget(6, 1, 0, true) // every delivery fails, nothing durable or a prefix
	r, err := sink.NewRunner(s, spec("down", "a"), tg, fastConfig())
	testutil.Must(t, err)
	start(t, r)
	testutil.Wait(t, 10*time.Second, func() error {
		st := r.Status()
		if st.Errors < 3 || st.State != sink.StateBackingOff || !strings.Contains(st.LastError, errFlaky.Error()) {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	p, err := s.PendingAfter(context.Background(), 0)
	testutil.Must(t, err)
	if p.Rows != 40 || p.Bytes < 40*100 {
		t.Fatalf("pending after 0: %+v, want 40 rows and at least 4000 bytes", p)
	}
}

// backInTime holds an id the store never had.
type backInTime struct{ memTarget }

func (b *backInTime) Resume(context.Context) (int64, error) { return 1000, nil }

// TestRunner_RefusesATargetAheadOfTheDatabase: a target holding ids the
// database never had is refused (an older database or another one), with
// the reason in the status, and nothing is delivered.
func TestRunner_RefusesATargetAheadOfTheDatabase(t *testing.T) {
	s := outboxtest.TempStore(t)
	emit(t, s, 0, 5, []string{"a"}, func(i int) string { return "v" })
	tg := &backInTime{*newMemTarget(7, 0, 0, true)}
	r, err := sink.NewRunner(s, spec("ahead", "a"), tg, fastConfig())
	testutil.Must(t, err)
	start(t, r)
	testutil.Wait(t, 10*time.Second, func() error {
		if st := r.Status(); st.State != sink.StateRefusing || !strings.Contains(st.LastError, "holds id 1000, the database's last is 5") {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	held, _ := tg.snapshot()
	testutil.Equal(t, "rows delivered", len(held), 0)
}

// blockedTarget takes nothing until released: a sink far behind.
type blockedTarget struct {
	memTarget
	release chan struct{}
}

func (b *blockedTarget) Deliver(ctx context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.memTarget.Deliver(ctx, rows)
}

// TestRunner_SlowSinkHoldsBackNoOther: a sink whose target blocks holds
// neither another sink of the same topic nor the store's progress of it;
// the outbox floor (pruning, the backlog bound) waits for it.
func TestRunner_SlowSinkHoldsBackNoOther(t *testing.T) {
	s := outboxtest.TempStore(t)
	ctx := context.Background()
	testutil.Must(t, s.SetConsumers(ctx, false, []string{"fast", "slow"}))
	slow := &blockedTarget{memTarget: *newMemTarget(10, 0, 0, true), release: make(chan struct{})}
	fast := newMemTarget(11, 0, 0, true)
	rs, err := sink.NewRunner(s, spec("slow", "a"), slow, fastConfig())
	testutil.Must(t, err)
	rf, err := sink.NewRunner(s, spec("fast", "a"), fast, fastConfig())
	testutil.Must(t, err)
	start(t, rs)
	start(t, rf)
	emit(t, s, 0, 500, []string{"a"}, func(i int) string { return fmt.Sprint(i) })
	waitDelivered(t, s, rf, 500)
	held, _ := fast.snapshot()
	testutil.Equal(t, "fast sink's rows", len(held), 500)
	testutil.Equal(t, "floor while slow is stuck", s.ConsumedThrough(), int64(0))
	p, err := s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "backlog while slow is stuck", p.Rows, int64(500))
	if st := rs.Status(); st.State != sink.StateDelivering || st.Delivered != 0 || st.Stored != 0 {
		t.Fatalf("slow sink status %+v", st)
	}
	close(slow.release)
	waitDelivered(t, s, rs, 500)
	testutil.Equal(t, "floor once slow caught up", s.ConsumedThrough(), int64(500))
}

// TestRunner_CountsRowsPrunedBeforeIt: a sink added after rows were
// pruned says how many it missed, and takes the rest.
func TestRunner_CountsRowsPrunedBeforeIt(t *testing.T) {
	s := outboxtest.TempStore(t)
	ctx := context.Background()
	emit(t, s, 0, 30, []string{"a"}, func(i int) string { return "v" })
	emit(t, s, 30, 30, []string{"a"}, func(i int) string { return "v" })
	n, err := s.Prune(ctx, 30, time.Now().Add(time.Hour))
	testutil.Must(t, err)
	testutil.Equal(t, "pruned", n, int64(30))
	tg := newMemTarget(12, 0, 0, true)
	r, err := sink.NewRunner(s, spec("late", "a"), tg, fastConfig())
	testutil.Must(t, err)
	start(t, r)
	waitDelivered(t, s, r, 60)
	testutil.Equal(t, "missed", r.Status().Missed, int64(30))
	held, _ := tg.snapshot()
	testutil.Equal(t, "rows taken", len(held), 30)
}
