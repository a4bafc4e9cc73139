// Package feedtest is the contract every ingest.Feed must meet, as a test
// suite: run it against a feed kind with Run and a Harness.
//
// The suite checks, on partition 0: a new feed yields a RecordEpoch, then the
// items in order with their exact values and strictly increasing positions;
// feeds opened again see the same epoch and positions; a feed opened from a
// checkpoint yields exactly the items after it; a replaced source yields a new
// epoch and then only its new items, running or opened after; Poll returns the
// context's error promptly; Ends reports the end.
package feedtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Timeouts of the suite. Generous, since they only bound waits on conditions.
const (
	// Timeout bounds every wait for records.
	Timeout = 10 * time.Second
	// Quiet is how long a feed must stay silent to show it yields nothing more.
	Quiet = 300 * time.Millisecond
	// Prompt bounds how long Poll may take to notice a cancelled context.
	Prompt = 2 * time.Second
)

// Harness gives the suite one source and feeds on it.
type Harness struct {
	// Name names the feed kind in failures.
	Name string
	// New returns a fresh, unopened feed on the same source each call. The
	// suite opens and closes it.
	New func(t *testing.T) ingest.Feed
	// Append adds items to the source: one line each for a file, one record
	// each to partition 0 for Kafka. Values hold no "\n".
	Append func(t *testing.T, values ...[]byte)
	// Replace replaces the source so its epoch changes (a file: renamed away
	// and a new one created; Kafka: the topic deleted and created again). The
	// new source starts empty.
	Replace func(t *testing.T)
}

// Run runs the contract suite against h's feed kind. The subtests share h's
// source and run in order; the suite keeps a model of what the source holds.
func Run(t *testing.T, h Harness) {
	s := &suite{h: h}
	s.append(t, "first", "", "third with spaces", "fourth")
	t.Run("NewFeedYieldsEpochThenItems", s.testNewFeed)
	t.Run("ReopenSameEpochAndPositions", s.testReopen)
	t.Run("ReopenFromCheckpoint", s.testFromCheckpoint)
	t.Run("AppendWhilePolling", s.testAppendWhilePolling)
	t.Run("Ends", s.testEnds)
	t.Run("PollCancelled", s.testPollCancelled)
	t.Run("ReplaceWhileRunning", s.testReplaceRunning)
	t.Run("ReplaceWhileStopped", s.testReplaceStopped)
}

// suite is the shared source's model: the values of its current epoch.
type suite struct {
	h      Harness
	values [][]byte
	n      int // values appended so far, to make each one distinct
}

// append appends values to the source and the model.
func (s *suite) append(t *testing.T, values ...string) {
	t.Helper()
	bs := make([][]byte, len(values))
	for i, v := range values {
		bs[i] = []byte(v)
	}
	s.h.Append(t, bs...)
	s.values = append(s.values, bs...)
	s.n += len(values)
}

// fresh returns n new distinct values.
func (s *suite) fresh(n int) []string {
	vs := make([]string, n)
	for i := range vs {
		vs[i] = fmt.Sprintf("value-%d", s.n+i)
	}
	return vs
}

// open returns a new feed opened from the checkpoints, closed at the end of t.
func (s *suite) open(t *testing.T, from map[int32]outbox.Checkpoint) ingest.Feed {
	t.Helper()
	f := s.h.New(t)
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("%s: close: %v", s.h.Name, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := f.Open(ctx, from); err != nil {
		t.Fatalf("%s: open from %v: %v", s.h.Name, from, err)
	}
	return f
}

// readAll opens a new feed and reads the source's current epoch whole,
// checking it against the model: a RecordEpoch first, then every item in
// order. It returns the feed and its records.
func (s *suite) readAll(t *testing.T) (ingest.Feed, []ingest.Record) {
	t.Helper()
	f := s.open(t, nil)
	recs := Collect(t, f, 1+len(s.values), Timeout)
	if recs[0].Kind != ingest.RecordEpoch || recs[0].Epoch == "" || recs[0].Partition != 0 {
		t.Fatalf("%s: first record %+v, want a RecordEpoch of partition 0", s.h.Name, recs[0])
	}
	CheckItems(t, recs[0].Epoch, recs[1:], s.values)
	if len(recs) > 1 && recs[0].Position > recs[1].Position {
		t.Errorf("%s: epoch starts at %d, after the first item's position %d", s.h.Name, recs[0].Position, recs[1].Position)
	}
	return f, recs
}

// caughtUp returns a feed opened from the checkpoint at the end of the
// current epoch, with that checkpoint. It needs at least one value.
func (s *suite) caughtUp(t *testing.T) (ingest.Feed, outbox.Checkpoint) {
	t.Helper()
	_, recs := s.readAll(t)
	last := recs[len(recs)-1]
	cp := outbox.Checkpoint{Partition: 0, Epoch: last.Epoch, Position: last.Position, End: last.Position}
	return s.open(t, map[int32]outbox.Checkpoint{0: cp}), cp
}

func (s *suite) testNewFeed(t *testing.T) {
	s.readAll(t)
}

func (s *suite) testReopen(t *testing.T) {
	_, a := s.readAll(t)
	_, b := s.readAll(t)
	if a[0].Epoch != b[0].Epoch {
		t.Errorf("%s: epochs %q and %q on the same source", s.h.Name, a[0].Epoch, b[0].Epoch)
	}
	for i := range a {
		if a[i].Position != b[i].Position {
			t.Errorf("%s: record %d at %d, then at %d on reopen", s.h.Name, i, a[i].Position, b[i].Position)
		}
	}
}

func (s *suite) testFromCheckpoint(t *testing.T) {
	_, all := s.readAll(t)
	items := all[1:]
	for _, k := range []int{0, len(items) / 2, len(items) - 1} {
		t.Run(fmt.Sprintf("After%d", k), func(t *testing.T) {
			cp := outbox.Checkpoint{Partition: 0, Epoch: all[0].Epoch, Position: items[k].Position, End: items[len(items)-1].Position}
			f := s.open(t, map[int32]outbox.Checkpoint{0: cp})
			rest := items[k+1:]
			got := Collect(t, f, len(rest), Timeout)
			for i := range rest {
				if got[i].Kind != ingest.RecordItem || got[i].Position != rest[i].Position ||
					got[i].Epoch != rest[i].Epoch || !bytes.Equal(got[i].Item.Value, rest[i].Item.Value) {
					t.Errorf("%s: after item %d, record %d is %s, want %s", s.h.Name, k, i, Describe(got[i]), Describe(rest[i]))
				}
			}
			NoMore(t, f, Quiet)
		})
	}
}

func (s *suite) testAppendWhilePolling(t *testing.T) {
	f, cp := s.caughtUp(t)
	NoMore(t, f, Quiet/3)
	got := make(chan []ingest.Record, 1)
	failed := make(chan error, 1)
	go func() {
		recs, err := collect(f, 2, Timeout)
		got <- recs
		failed <- err
	}()
	vs := s.fresh(2)
	s.append(t, vs...)
	recs, err := <-got, <-failed
	if err != nil {
		t.Fatalf("%s: %v after %d records", s.h.Name, err, len(recs))
	}
	CheckItems(t, cp.Epoch, recs, [][]byte{[]byte(vs[0]), []byte(vs[1])})
	if recs[0].Position <= cp.Position {
		t.Errorf("%s: appended item at %d, not after the checkpoint's %d", s.h.Name, recs[0].Position, cp.Position)
	}
}

func (s *suite) testEnds(t *testing.T) {
	f, recs := s.readAll(t)
	end := recs[len(recs)-1].Position
	Wait(t, Timeout, func() error {
		if got := f.Ends()[0]; got != end {
			return fmt.Errorf("%s: Ends()[0] = %d, want %d", s.h.Name, got, end)
		}
		return nil
	})
}

func (s *suite) testPollCancelled(t *testing.T) {
	f, _ := s.caughtUp(t)
	t.Run("AlreadyCancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		pollCancelled(t, s.h.Name, f, ctx)
	})
	t.Run("CancelledWhileWaiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(Quiet/3, cancel)
		defer stop.Stop()
		pollCancelled(t, s.h.Name, f, ctx)
	})
}

// pollCancelled polls f with a context cancelled now or soon and checks that
// Poll returns context.Canceled promptly, with no record.
func pollCancelled(t *testing.T, name string, f ingest.Feed, ctx context.Context) {
	t.Helper()
	start := time.Now()
	recs, err := f.Poll(ctx, nil, 10)
	if !errors.Is(err, context.Canceled) || len(recs) != 0 {
		t.Fatalf("%s: Poll = %d records, %v; want none and context.Canceled", name, len(recs), err)
	}
	if took := time.Since(start); took > Prompt {
		t.Errorf("%s: Poll took %v to return after cancel", name, took)
	}
}

func (s *suite) testReplaceRunning(t *testing.T) {
	f, cp := s.caughtUp(t)
	s.h.Replace(t)
	s.values = nil
	vs := s.fresh(2)
	s.append(t, vs...)
	recs := CollectItems(t, f, 2, Timeout)
	epoch := checkReplaced(t, s.h.Name, cp.Epoch, recs, vs)
	NoMore(t, f, Quiet)
	if _, again := s.readAll(t); again[0].Epoch != epoch {
		t.Errorf("%s: a new feed sees epoch %q, the running one %q", s.h.Name, again[0].Epoch, epoch)
	}
}

func (s *suite) testReplaceStopped(t *testing.T) {
	_, recs := s.readAll(t)
	last := recs[len(recs)-1]
	cp := outbox.Checkpoint{Partition: 0, Epoch: last.Epoch, Position: last.Position, End: last.Position}
	s.h.Replace(t)
	s.values = nil
	vs := s.fresh(2)
	s.append(t, vs...)
	f := s.open(t, map[int32]outbox.Checkpoint{0: cp})
	checkReplaced(t, s.h.Name, cp.Epoch, CollectItems(t, f, 2, Timeout), vs)
	NoMore(t, f, Quiet)
}

// checkReplaced checks the records a feed yields after its source of epoch old
// was replaced and values appended: any RecordLoss of epoch old, then one
// RecordEpoch with another epoch, then the values. It returns the new epoch.
func checkReplaced(t *testing.T, name, old string, recs []ingest.Record, values []string) string {
	t.Helper()
	i := 0
	for i < len(recs) && recs[i].Kind == ingest.RecordLoss && recs[i].Epoch == old {
		i++
	}
	if i >= len(recs) || recs[i].Kind != ingest.RecordEpoch || recs[i].Epoch == old || recs[i].Epoch == "" {
		t.Fatalf("%s: after replace got %s, want a RecordEpoch other than %q", name, DescribeAll(recs), old)
	}
	want := make([][]byte, len(values))
	for j, v := range values {
		want[j] = []byte(v)
	}
	CheckItems(t, recs[i].Epoch, recs[i+1:], want)
	return recs[i].Epoch
}

// CheckItems checks that recs are items of partition 0 and epoch, with
// exactly the values want, in order, at strictly increasing positions.
func CheckItems(t testing.TB, epoch string, recs []ingest.Record, want [][]byte) {
	t.Helper()
	if len(recs) != len(want) {
		t.Fatalf("got %d records %s, want %d items", len(recs), DescribeAll(recs), len(want))
	}
	for i, r := range recs {
		if r.Kind != ingest.RecordItem || r.Partition != 0 || r.Epoch != epoch || !bytes.Equal(r.Item.Value, want[i]) {
			t.Errorf("record %d is %s, want item %q of epoch %q", i, Describe(r), want[i], epoch)
		}
		if i > 0 && r.Position <= recs[i-1].Position {
			t.Errorf("record %d at %d, not after %d", i, r.Position, recs[i-1].Position)
		}
	}
}

// Collect polls f until it has yielded n records, and fails t when that takes
// longer than timeout or Poll fails.
func Collect(t testing.TB, f ingest.Feed, n int, timeout time.Duration) []ingest.Record {
	t.Helper()
	recs, err := collect(f, n, timeout)
	if err != nil {
		t.Fatalf("collect %d records: %v; got %s", n, err, DescribeAll(recs))
	}
	return recs
}

func collect(f ingest.Feed, n int, timeout time.Duration) ([]ingest.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var recs []ingest.Record
	for len(recs) < n {
		var err error
		if recs, err = f.Poll(ctx, recs, n-len(recs)); err != nil {
			return recs, err
		}
	}
	if len(recs) > n {
		return recs, fmt.Errorf("Poll returned %d records, more than asked", len(recs))
	}
	return recs, nil
}

// CollectItems polls f until it has yielded n items (and whatever records
// come before them), and fails t when that takes longer than timeout.
func CollectItems(t testing.TB, f ingest.Feed, n int, timeout time.Duration) []ingest.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var recs []ingest.Record
	for items := 0; items < n; {
		next, err := f.Poll(ctx, nil, 1)
		if err != nil {
			t.Fatalf("collect %d items: %v; got %s", n, err, DescribeAll(recs))
		}
		recs = append(recs, next...)
		if next[0].Kind == ingest.RecordItem {
			items++
		}
	}
	return recs
}

// NoMore checks that f yields nothing within quiet.
func NoMore(t testing.TB, f ingest.Feed, quiet time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), quiet)
	defer cancel()
	recs, err := f.Poll(ctx, nil, 10)
	if !errors.Is(err, context.DeadlineExceeded) || len(recs) != 0 {
		t.Fatalf("want no record, got %s, %v", DescribeAll(recs), err)
	}
}

// Wait calls cond every 50 ms until it returns nil, and fails tb with its last
// error when timeout passes first.
func Wait(tb testing.TB, timeout time.Duration, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("after %v: %v", timeout, err)
		}
		<-tick.C
	}
}

// Describe formats a record for failure messages.
func Describe(r ingest.Record) string {
	switch r.Kind {
	case ingest.RecordEpoch:
		return fmt.Sprintf("epoch(%q @%d)", r.Epoch, r.Position)
	case ingest.RecordLoss:
		return fmt.Sprintf("loss(%q %d..%d %q)", r.Epoch, r.From, r.To, r.Reason)
	}
	if r.BadReason != "" {
		return fmt.Sprintf("bad(%q @%d %s: %v)", r.Item.Value, r.Position, r.BadReason, r.BadErr)
	}
	return fmt.Sprintf("item(%q @%d %q)", r.Item.Value, r.Position, r.Epoch)
}

// DescribeAll formats records for failure messages.
func DescribeAll(recs []ingest.Record) string {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, r := range recs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(Describe(r))
	}
	b.WriteByte(']')
	return b.String()
}
