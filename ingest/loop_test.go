package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// memFeed is an in-memory feed of one partition: a real Feed, for testing
// the loop without a file.
type memFeed struct {
	mu        sync.Mutex
	recs      []ingest.Record
	next      int
	wake      chan struct{}
	committed []outbox.Checkpoint
}

func newMemFeed(epoch string, values ...string) *memFeed {
	f := &memFeed{wake: make(chan struct{}, 1)}
	f.add(ingest.Record{Kind: ingest.RecordEpoch, Epoch: epoch})
	f.append(epoch, values...)
	return f
}

func (f *memFeed) add(rs ...ingest.Record) {
	f.mu.Lock()
	f.recs = append(f.recs, rs...)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// append adds items whose positions follow the epoch's last one, 1, 2, 3,
// ... for a new epoch.
func (f *memFeed) append(epoch string, values ...string) {
	f.mu.Lock()
	pos := int64(0)
	for _, r := range f.recs {
		if r.Kind == ingest.RecordItem && r.Epoch == epoch {
			pos = r.Position
		}
	}
	f.mu.Unlock()
	recs := make([]ingest.Record, 0, len(values))
	for _, v := range values {
		pos++
		recs = append(recs, ingest.Record{Kind: ingest.RecordItem, Epoch: epoch, Position: pos, Item: ingest.Item{Value: []byte(v)}})
	}
	f.add(recs...) // at once: a Poll sees all of them or none
}

func (f *memFeed) Kind() string   { return "file" }
func (f *memFeed) Source() string { return "memory" }

func (f *memFeed) Open(_ context.Context, from map[int32]outbox.Checkpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cp, ok := from[0]
	if !ok {
		return nil
	}
	for i, r := range f.recs {
		if r.Epoch == cp.Epoch && (r.Kind == ingest.RecordEpoch || r.Position <= cp.Position) {
			f.next = i + 1
		}
	}
	return nil
}

func (f *memFeed) Poll(ctx context.Context, buf []ingest.Record, max int) ([]ingest.Record, error) {
	for {
		f.mu.Lock()
		n := min(len(f.recs)-f.next, max)
		buf = append(buf, f.recs[f.next:f.next+n]...)
		f.next += n
		f.mu.Unlock()
		if n > 0 {
			return buf, nil
		}
		select {
		case <-ctx.Done():
			return buf, ctx.Err()
		case <-f.wake:
		}
	}
}

func (f *memFeed) Commit(_ context.Context, through []outbox.Checkpoint) error {
	f.mu.Lock()
	f.committed = append(f.committed, through...)
	f.mu.Unlock()
	return nil
}

func (f *memFeed) Ends() map[int32]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var end int64
	for _, r := range f.recs {
		if r.Kind == ingest.RecordItem {
			end = r.Position
		}
	}
	return map[int32]int64{0: end}
}

func (f *memFeed) Close() error { return nil }

// counter is a processor that counts each value in a table, emits it, and
// fails as its script says: fail[value] transient errors first, or a
// permanent one for values starting with "bad".
type counter struct {
	mu       sync.Mutex
	fail     map[string]int
	attempts map[string][]int
}

func newCounter() *counter { return &counter{fail: map[string]int{}, attempts: map[string][]int{}} }

func (c *counter) Setup(ctx context.Context, tx *outbox.Tx) error {
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS counts (value TEXT PRIMARY KEY, n INTEGER NOT NULL)`)
	return err
}

func (c *counter) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	v := string(item.Value)
	c.mu.Lock()
	c.attempts[v] = append(c.attempts[v], d.Attempt)
	fail := c.fail[v] > 0
	if fail {
		c.fail[v]--
	}
	c.mu.Unlock()
	// Write before failing, so a failure shows whether the savepoint undid it.
	if _, err := tx.Exec(ctx, `INSERT INTO counts VALUES (?, 1) ON CONFLICT(value) DO UPDATE SET n = n + 1`, v); err != nil {
		return err
	}
	if err := tx.Emit(ctx, outbox.Output{Topic: "out", Value: item.Value}); err != nil {
		return err
	}
	if strings.HasPrefix(v, "bad") {
		return ingest.Malformed("value %q is bad", v)
	}
	if fail {
		return errors.New("transient trouble")
	}
	return nil
}

func testConfig() ingest.Config {
	cfg := ingest.DefaultConfig("f")
	cfg.Retry = ingest.Retry{Attempts: 3, MinDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, AttemptTimeout: time.Second}
	cfg.CommitRetry = cfg.Retry
	return cfg
}

// running starts a loop and returns a stop function that waits for Run.
func running(t *testing.T, s *outbox.Store, f ingest.Feed, p ingest.Processor, cfg ingest.Config) (*ingest.Loop, func() error) {
	t.Helper()
	l, err := ingest.NewLoop(s, f, p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	var rerr error
	stop := func() error {
		once.Do(func() { cancel(); rerr = <-done })
		return rerr
	}
	t.Cleanup(func() { stop() })
	return l, stop
}

// wait is testutil.Wait.
var wait = testutil.Wait

// stateIs is a condition: the loop's state and last error are these.
func stateIs(l *ingest.Loop, state outbox.FeedState, lastError string) func() error {
	return func() error {
		st, e := l.State()
		if st != state || e != lastError {
			return fmt.Errorf("state %s (%q), want %s (%q)", st, e, state, lastError)
		}
		return nil
	}
}

func positionIs(s *outbox.Store, feed string, epoch string, pos int64) func() error {
	return func() error {
		cps, err := s.Positions(context.Background(), feed)
		if err != nil {
			return err
		}
		if cps[0].Epoch != epoch || cps[0].Position != pos {
			return fmt.Errorf("position %s/%d, want %s/%d", cps[0].Epoch, cps[0].Position, epoch, pos)
		}
		return nil
	}
}

func counts(t *testing.T, s *outbox.Store) map[string]int {
	t.Helper()
	var rows []struct {
		Value string `db:"value"`
		N     int    `db:"n"`
	}
	if err := outboxtest.Select(context.Background(), s, &rows, `SELECT value, n FROM counts`); err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, r := range rows {
		m[r.Value] = r.N
	}
	return m
}

type rowPlace struct {
	Topic    string
	Epoch    string
	Position int64
	N        int
	Value    string
}

func outboxRows(t *testing.T, s *outbox.Store) []rowPlace {
	t.Helper()
	rows, err := s.Rows(context.Background(), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []rowPlace
	for i, r := range rows {
		if i > 0 && r.ID <= rows[i-1].ID {
			t.Fatalf("outbox ids not increasing: %d after %d", r.ID, rows[i-1].ID)
		}
		out = append(out, rowPlace{r.Topic, r.Epoch, r.Position, r.N, string(r.Value)})
	}
	return out
}

func stats(t *testing.T, s *outbox.Store) outbox.FeedStats {
	t.Helper()
	f, err := s.Feed(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func equal[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	testutil.Equal(t, what, got, want)
}
