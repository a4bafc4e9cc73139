package filefeed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
)

// ffTimeout bounds waits for records; ffQuiet is how long a feed must stay
// silent to show it has nothing more.
const (
	ffTimeout = 10 * time.Second
	ffQuiet   = 150 * time.Millisecond
)

// ffFile is a test's log file.
type ffFile struct {
	t    *testing.T
	path string
}

func ffNewFile(t *testing.T) *ffFile {
	return &ffFile{t: t, path: filepath.Join(t.TempDir(), "app.log")}
}

// write appends s to the file at path (the test's file by default),
// creating it.
func (ff *ffFile) write(s string, path ...string) {
	ff.t.Helper()
	p := ff.path
	if len(path) > 0 {
		p = path[0]
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		ff.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		ff.t.Fatal(err)
	}
}

// truncate truncates the file in place to size, as copytruncate does.
func (ff *ffFile) truncate(size int64) {
	ff.t.Helper()
	if err := os.Truncate(ff.path, size); err != nil {
		ff.t.Fatal(err)
	}
}

// rename moves the file to path+suffix and returns the new name.
func (ff *ffFile) rename(suffix string) string {
	ff.t.Helper()
	to := ff.path + suffix
	if err := os.Rename(ff.path, to); err != nil {
		ff.t.Fatal(err)
	}
	return to
}

func (ff *ffFile) remove() {
	ff.t.Helper()
	if err := os.Remove(ff.path); err != nil {
		ff.t.Fatal(err)
	}
}

// identity returns the identity of the file now at path.
func (ff *ffFile) identity() fileID {
	ff.t.Helper()
	fi, err := os.Stat(ff.path)
	if err != nil {
		ff.t.Fatal(err)
	}
	data, err := os.ReadFile(ff.path)
	if err != nil {
		ff.t.Fatal(err)
	}
	id := fileIDOf(fi)
	fp, ok := fileFingerprint(data)
	if !ok {
		ff.t.Fatalf("%s has no fingerprint yet", ff.path)
	}
	id.fp = fp
	return id
}

// epoch returns the plain epoch of the file now at path.
func (ff *ffFile) epoch() string { return ff.identity().String() }

// open returns a feed on the file opened from cp (a new feed for a zero cp),
// closed at the end of the test.
func (ff *ffFile) open(cp outbox.Checkpoint, opts ...Options) *Feed {
	ff.t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.PollInterval == 0 {
		o.PollInterval = 20 * time.Millisecond
	}
	o.Logger = slog.New(slog.NewTextHandler(ff.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := New(ff.path, o)
	ff.t.Cleanup(func() {
		if err := f.Close(); err != nil {
			ff.t.Errorf("close: %v", err)
		}
	})
	from := map[int32]outbox.Checkpoint{}
	if cp.Epoch != "" {
		from[0] = cp
	}
	if err := f.Open(context.Background(), from); err != nil {
		ff.t.Fatalf("open: %v", err)
	}
	return f
}

// ffCheckpoint is the checkpoint the loop stores after r.
func ffCheckpoint(r ingest.Record, end int64) outbox.Checkpoint {
	return outbox.Checkpoint{Partition: 0, Epoch: r.Epoch, Position: r.Position, End: end}
}

// ffCollect polls f until it yields n records.
func ffCollect(t *testing.T, f ingest.Feed, n int) []ingest.Record {
	t.Helper()
	recs, err := ffPollN(f, n, 0)
	if err != nil {
		t.Fatalf("collect %d records: %v; got %v", n, err, ffDescribeAll(recs))
	}
	return recs
}

// ffPollN polls f until it yields n records, asking for at most batch at a
// time (0: as many as missing).
func ffPollN(f ingest.Feed, n, batch int) ([]ingest.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ffTimeout)
	defer cancel()
	var recs []ingest.Record
	for len(recs) < n {
		ask := n - len(recs)
		if batch > 0 {
			ask = min(ask, batch)
		}
		before := len(recs)
		var err error
		if recs, err = f.Poll(ctx, recs, ask); err != nil {
			return recs, err
		}
		if got := len(recs) - before; got > ask || got == 0 {
			return recs, fmt.Errorf("Poll returned %d records for max %d", got, ask)
		}
	}
	return recs, nil
}

// ffExpect collects len(want) records from f, checks them against want (see
// ffDescribe), then checks that nothing more comes.
func ffExpect(t *testing.T, f ingest.Feed, want ...string) []ingest.Record {
	t.Helper()
	recs := ffCollect(t, f, len(want))
	if got := ffDescribeAll(recs); !slices.Equal(got, want) {
		t.Fatalf("records:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
	ffNoMore(t, f)
	return recs
}

// ffNoMore checks that f yields nothing for ffQuiet.
func ffNoMore(t *testing.T, f ingest.Feed) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ffQuiet)
	defer cancel()
	recs, err := f.Poll(ctx, nil, 10)
	if !errors.Is(err, context.DeadlineExceeded) || len(recs) != 0 {
		t.Fatalf("want nothing, got %v, %v", ffDescribeAll(recs), err)
	}
}

// ffDescribe formats a record as the tests spell their expectations.
func ffDescribe(r ingest.Record) string {
	switch {
	case r.Partition != 0:
		return fmt.Sprintf("partition %d", r.Partition)
	case r.Kind == ingest.RecordEpoch:
		return fmt.Sprintf("epoch %s @%d", r.Epoch, r.Position)
	case r.Kind == ingest.RecordLoss:
		return fmt.Sprintf("loss %s %d-%d %s", r.Epoch, r.From, r.To, r.Reason)
	case r.BadReason != "" || r.BadErr != nil:
		return fmt.Sprintf("bad %s @%d %q %s", r.Epoch, r.Position, r.Item.Value, r.BadReason)
	case r.Item.Key != nil || r.Item.Value == nil:
		return fmt.Sprintf("item with key %q, value %v", r.Item.Key, r.Item.Value)
	}
	return fmt.Sprintf("item %s @%d %q", r.Epoch, r.Position, r.Item.Value)
}

func ffDescribeAll(recs []ingest.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = ffDescribe(r)
	}
	return out
}

func ffEpochRec(epoch string) string { return fmt.Sprintf("epoch %s @0", epoch) }

func ffItem(epoch string, pos int64, value string) string {
	return fmt.Sprintf("item %s @%d %q", epoch, pos, value)
}

func ffBad(epoch string, pos int64, value string) string {
	return fmt.Sprintf("bad %s @%d %q %s", epoch, pos, value, ingest.ReasonTooLong)
}

func ffLoss(epoch string, from, to int64, reason string) string {
	return fmt.Sprintf("loss %s %d-%d %s", epoch, from, to, reason)
}

// ffRestart checks that a feed opened again from the checkpoint after last
// yields nothing old, and goes on with the next line in last's epoch.
func ffRestart(t *testing.T, ff *ffFile, last ingest.Record) {
	t.Helper()
	fi, err := os.Stat(ff.path)
	if err != nil {
		t.Fatal(err)
	}
	f := ff.open(ffCheckpoint(last, fi.Size()))
	ffNoMore(t, f)
	ff.write("next\n")
	ffExpect(t, f, ffItem(last.Epoch, last.Position+5, "next"))
}

func TestFeed_Open(t *testing.T) {
	t.Run("Accessors", func(t *testing.T) {
		ff := ffNewFile(t)
		f := ff.open(outbox.Checkpoint{})
		if f.Kind() != ingest.KindFile || f.Source() != ff.path {
			t.Errorf("Kind, Source = %q, %q", f.Kind(), f.Source())
		}
		if err := f.Commit(context.Background(), []outbox.Checkpoint{{Position: 1}}); err != nil {
			t.Errorf("Commit: %v", err)
		}
		if err := f.Open(context.Background(), nil); err == nil {
			t.Error("second Open: no error")
		}
	})
	t.Run("FileAppearsLater", func(t *testing.T) {
		ff := ffNewFile(t)
		f := ff.open(outbox.Checkpoint{})
		if got := f.Ends(); got[0] != 0 || len(got) != 1 {
			t.Errorf("Ends = %v, want {0: 0}", got)
		}
		ffNoMore(t, f)
		ff.write("")
		ffNoMore(t, f) // no first line: no epoch yet
		ff.write("a\n")
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		if got := f.Ends()[0]; got != 2 {
			t.Errorf("Ends()[0] = %d, want 2", got)
		}
	})
	t.Run("CloseWakesPoll", func(t *testing.T) {
		ff := ffNewFile(t)
		f := ff.open(outbox.Checkpoint{})
		done := make(chan error, 1)
		go func() {
			_, err := f.Poll(context.Background(), nil, 1)
			done <- err
		}()
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, fs.ErrClosed) {
				t.Errorf("Poll after Close: %v, want fs.ErrClosed", err)
			}
		case <-time.After(ffTimeout):
			t.Fatal("Poll still waiting after Close")
		}
		if err := f.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

// TestFeed_Watch checks that file-system events wake the feed, so that
// appends and rotations arrive without waiting for the poll interval.
func TestFeed_Watch(t *testing.T) {
	ff := ffNewFile(t)
	f := ff.open(outbox.Checkpoint{}, Options{PollInterval: time.Hour})
	if f.watcher == nil {
		t.Skip("no file-system watcher on this platform")
	}
	ffWakes(t, f, func() { ff.write("a\n") }) // created in the watched directory
	e := ff.epoch()
	ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
	ffWakes(t, f, func() { ff.write("b\n") })
	ffExpect(t, f, ffItem(e, 4, "b"))
	old := ff.rename(".1")
	ffWakes(t, f, func() { ff.write("c\n", old) }) // the renamed file, still watched
	ffExpect(t, f, ffItem(e, 6, "c"))
	ffWakes(t, f, func() { ff.write("d\n") })
	e2 := ff.epoch()
	ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "d"))
	ffWakes(t, f, func() { ff.truncate(0) })
	ff.write("x\n")
	e3 := nextFileEpoch(ff.identity(), e2)
	ffExpect(t, f, ffEpochRec(e3), ffItem(e3, 2, "x"))
}

// ffWakes checks that do makes the watcher wake the feed (no Poll runs to
// take the wake-up).
func ffWakes(t *testing.T, f *Feed, do func()) {
	t.Helper()
	select {
	case <-f.wake: // drop an earlier wake-up
	default:
	}
	do()
	testutil.Wait(t, ffTimeout, func() error {
		if len(f.wake) == 0 {
			return errors.New("no wake-up from the watcher")
		}
		return nil
	})
}

func TestFeed_Append(t *testing.T) {
	t.Run("WhilePolling", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		f := ff.open(outbox.Checkpoint{})
		type result struct {
			recs []ingest.Record
			err  error
		}
		done := make(chan result, 1)
		go func() {
			recs, err := ffPollN(f, 4, 1)
			done <- result{recs, err}
		}()
		ff.write("one\n")
		e := ff.epoch()
		ff.write("two\nthr")
		ff.write("ee\n")
		ff.write("four\n")
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		want := []string{ffEpochRec(e), ffItem(e, 4, "one"), ffItem(e, 8, "two"), ffItem(e, 14, "three")}
		if got := ffDescribeAll(res.recs); !slices.Equal(got, want) {
			t.Fatalf("got %q, want %q", got, want)
		}
		recs := ffExpect(t, f, ffItem(e, 19, "four"))
		ffRestart(t, ff, recs[0])
	})
	t.Run("PartialLineWaits", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("first\nab")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 6, "first"))
		ff.write("c\nd")
		ffExpect(t, f, ffItem(e, 10, "abc"))
		ffNoMore(t, f) // "d" waits for its "\n"
		ff.write("\n")
		recs := ffExpect(t, f, ffItem(e, 12, "d"))
		ffRestart(t, ff, recs[0])
	})
	t.Run("CRLFAndEmptyLines", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\r\n\r\n\nb\r\r\n\rc\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		recs := ffExpect(t, f, ffEpochRec(e), ffItem(e, 3, "a"), ffItem(e, 5, ""), ffItem(e, 6, ""),
			ffItem(e, 10, "b\r"), ffItem(e, 13, "\rc"))
		ffRestart(t, ff, recs[len(recs)-1])
	})
	t.Run("PollFillsUpToMax", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("0\n1\n2\n3\n4\n5\n6\n7\n8\n9\n")
		f := ff.open(outbox.Checkpoint{})
		ctx, cancel := context.WithTimeout(context.Background(), ffTimeout)
		defer cancel()
		recs, err := f.Poll(ctx, nil, 4)
		if err != nil || len(recs) != 4 {
			t.Fatalf("Poll(max 4) = %d records, %v; want 4", len(recs), err)
		}
		recs, err = f.Poll(ctx, recs, 100) // returns what is ready, without waiting for more
		if err != nil || len(recs) != 11 || recs[10].Position != 20 {
			t.Fatalf("Poll(max 100) = %v, %v; want the 7 other lines", ffDescribeAll(recs), err)
		}
	})
	t.Run("BatchesAndValuesNotOverwritten", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		var want []string
		var all strings.Builder
		e := ""
		for i := range 4000 { // about 200 KiB: the read buffer is reused many times
			line := fmt.Sprintf("line %04d %s", i, strings.Repeat("x", i%97))
			all.WriteString(line + "\n")
			if i == 0 {
				ff.write(all.String())
				e = ff.epoch()
				want = append(want, ffEpochRec(e))
			}
			want = append(want, ffItem(e, int64(all.Len()), line))
		}
		ff.write(all.String()[len("line 0000 \n"):])
		f := ff.open(outbox.Checkpoint{})
		recs, err := ffPollN(f, len(want), 7)
		if err != nil {
			t.Fatal(err)
		}
		if got := ffDescribeAll(recs); !slices.Equal(got, want) {
			t.Fatalf("%d records differ; first: %q", len(got), ffFirstDiff(got, want))
		}
		ffNoMore(t, f)
		if got := f.Ends()[0]; got != int64(all.Len()) {
			t.Errorf("Ends()[0] = %d, want %d", got, all.Len())
		}
	})
}

// ffFirstDiff returns the first pair of differing strings.
func ffFirstDiff(got, want []string) [2]string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return [2]string{g, w}
		}
	}
	return [2]string{}
}

func TestFeed_LongLine(t *testing.T) {
	opts := Options{MaxLine: 16}
	t.Run("WholeInFile", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		long := strings.Repeat("x", 100)
		ff.write("short\n" + long + "\nafter\n" + strings.Repeat("y", 16) + "\r\n" + strings.Repeat("z", 17) + "\r\n")
		f := ff.open(outbox.Checkpoint{}, opts)
		e := ff.epoch()
		recs := ffExpect(t, f, ffEpochRec(e), ffItem(e, 6, "short"), ffBad(e, 107, long[:16]), ffItem(e, 113, "after"),
			ffItem(e, 131, strings.Repeat("y", 16)), ffBad(e, 150, strings.Repeat("z", 16)))
		if err := recs[2].BadErr; err == nil || !strings.Contains(err.Error(), "100 bytes") {
			t.Errorf("BadErr = %v, want it to give the length, 100 bytes", err)
		}
		ffRestart(t, ff, recs[len(recs)-1])
	})
	t.Run("ArrivingInPieces", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{}, opts)
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		for range 5 {
			ff.write(strings.Repeat("0123456789", 7))
			ffNoMore(t, f)
		}
		ff.write("\nb\n")
		recs := ffExpect(t, f, ffBad(e, 353, "0123456789012345"), ffItem(e, 355, "b"))
		ffRestart(t, ff, recs[1])
	})
	t.Run("LongerThanTheReadBuffer", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n" + strings.Repeat("w", 3*fileReadSize+5) + "\nb\n")
		f := ff.open(outbox.Checkpoint{}, opts)
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"), ffBad(e, 3*fileReadSize+8, strings.Repeat("w", 16)),
			ffItem(e, 3*fileReadSize+10, "b"))
	})
}

func TestFeed_Truncate(t *testing.T) {
	t.Run("WhileRunning", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"), ffItem(e, 4, "b"))
		ff.truncate(0)
		ff.write("c\n")
		e1 := ff.epoch() + ":t1"
		recs := ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 2, "c"))
		ffRestart(t, ff, recs[1])
	})
	t.Run("WhileRunningWithUnreadBytes", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"), ffItem(e, 4, "b"))
		ff.write("unfinished")
		ffNoMore(t, f) // the feed has seen 14 bytes
		ff.truncate(0)
		ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossTruncated)) // the new epoch waits for a first line
		ff.write("a\nx\n")
		e1 := e + ":t1" // the same first line: the generation tells the epochs apart
		recs := ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 2, "a"), ffItem(e1, 4, "x"))
		ff.truncate(0)
		ff.write("a\n")
		e2 := e + ":t2"
		recs = ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "a"))
		ffRestart(t, ff, recs[1])
	})
	t.Run("RegrownBetweenLooks", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"), ffItem(e, 4, "b"))
		ff.truncate(0)
		ff.write("cccc\ndddd\n") // longer than before: only the first line tells
		e1 := ff.epoch() + ":t1"
		recs := ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 5, "cccc"), ffItem(e1, 10, "dddd"))
		ffRestart(t, ff, recs[2])
	})
	t.Run("AtRestart", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\nc\n")
		e := ff.epoch()
		cp := outbox.Checkpoint{Epoch: e, Position: 4, End: 6} // c seen, not applied
		ff.truncate(0)
		ff.write("x\n")
		f := ff.open(cp)
		e1 := ff.epoch() + ":t1"
		recs := ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossTruncated), ffEpochRec(e1), ffItem(e1, 2, "x"))
		ffRestart(t, ff, recs[2])
	})
	t.Run("AtRestartNothingSeenUnread", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		ff.truncate(0)
		ff.write("a\n")
		// Nothing unread was seen, but the writer may have written more
		// before the truncation, while the feed was stopped: with no copy,
		// the extent is unknown.
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 4, End: 4})
		e1 := e + ":t1"
		ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossUnseenTruncated), ffEpochRec(e1), ffItem(e1, 2, "a"))
		ff.write("b\n")
		ffExpect(t, f, ffItem(e1, 4, "b"))
		// Truncated again while stopped: the generation goes on from the stored epoch.
		ff.truncate(0)
		ff.write("a\n")
		f = ff.open(outbox.Checkpoint{Epoch: e1, Position: 4, End: 4})
		e2 := e + ":t2"
		recs := ffExpect(t, f, ffLoss(e1, 4, ingest.UnknownPosition, LossUnseenTruncated), ffEpochRec(e2), ffItem(e2, 2, "a"))
		ffRestart(t, ff, recs[2])
	})
	t.Run("AtRestartFirstLineNotBack", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		ff.truncate(0)
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 2, End: 4})
		ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossTruncated))
		ff.write("new\n")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 4, "new"))
	})
}

func TestFeed_Rotate(t *testing.T) {
	t.Run("RenameWithUnreadTail", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"), ffItem(e, 4, "b"))
		old := ff.rename(".1")
		ff.write("c\n", old) // the writer has not reopened yet
		ff.write("d\n")
		e2 := ff.epoch()
		recs := ffExpect(t, f, ffItem(e, 6, "c"), ffEpochRec(e2), ffItem(e2, 2, "d"))
		ffRestart(t, ff, recs[2])
	})
	t.Run("RenameWithUnterminatedTail", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		old := ff.rename(".1")
		ff.write("b\npart", old)
		ff.write("d\n")
		e2 := ff.epoch()
		recs := ffExpect(t, f, ffItem(e, 4, "b"), ffLoss(e, 4, 8, LossUnterminated), ffEpochRec(e2), ffItem(e2, 2, "d"))
		ffRestart(t, ff, recs[3])
	})
	t.Run("NewFileWaitsForItsFirstLine", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		old := ff.rename(".1")
		ff.write("")
		ffNoMore(t, f)
		ff.write("b\n", old) // still read: the new file has no epoch yet
		ffExpect(t, f, ffItem(e, 4, "b"))
		ff.write("c\n")
		e2 := ff.epoch()
		recs := ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "c"))
		ffRestart(t, ff, recs[1])
	})
	t.Run("DeleteAndCreate", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		ff.remove()
		ffNoMore(t, f)
		ff.write("a\n") // the same first line: the inode tells
		e2 := ff.epoch()
		if e2 == e {
			t.Fatalf("new file has the old epoch %s", e)
		}
		recs := ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "a"))
		ffRestart(t, ff, recs[1])
	})
	t.Run("WhileStoppedRenamedBeside", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		ff.write("c\n")
		old := ff.rename(".1")
		ff.write("ignored\n", old+".other") // another file in the directory
		ff.write("d\n")
		e2 := ff.epoch()
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 4, End: 4})
		recs := ffExpect(t, f, ffItem(e, 6, "c"), ffEpochRec(e2), ffItem(e2, 2, "d"))
		ffRestart(t, ff, recs[2])
	})
	t.Run("WhileStoppedRenamedBesideNoNewFileYet", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		ff.rename(".1")
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 2, End: 4})
		ffExpect(t, f, ffItem(e, 4, "b"))
		ff.write("d\n")
		e2 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "d"))
	})
	t.Run("WhileStoppedReplaced", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\nc\n")
		e := ff.epoch()
		ff.write("d\n", ff.path+".new")
		if err := os.Rename(ff.path+".new", ff.path); err != nil { // the old file is gone
			t.Fatal(err)
		}
		e2 := ff.epoch()
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 4, End: 6})
		recs := ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossVanished), ffEpochRec(e2), ffItem(e2, 2, "d"))
		ffRestart(t, ff, recs[2])
	})
	t.Run("WhileStoppedDeletedNotRecreated", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		e := ff.epoch()
		ff.remove()
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 2, End: 0})
		// Nothing seen was unread, but bytes written after the last look
		// cannot be ruled out.
		ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossVanished))
		ff.write("d\n")
		e2 := nextFileEpoch(ff.identity(), e) // the new file may have the old one's inode
		ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "d"))
	})
	t.Run("UnknownEpochFormat", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{Epoch: "topic-uuid/0", Position: 9, End: 12})
		e := ff.epoch()
		ffExpect(t, f, ffLoss("topic-uuid/0", 9, ingest.UnknownPosition, LossVanished), ffEpochRec(e), ffItem(e, 2, "a"))
	})
}

func FuzzLineSplitter(f *testing.F) {
	f.Add([]byte("a\nb\r\n\nlonger than four\r\r\n\rx\r\npartial"), []byte{0, 2, 5, 9}, uint8(3))
	f.Add([]byte("\n\n\r\n"), []byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, data, cuts []byte, maxLine uint8) {
		limit := int(maxLine%64) + 1
		s := newLineSplitter(limit, 0)
		var got []fileLine
		buf := make([]byte, 256) // reused for every chunk, as a read buffer is
		for i, rest := 0, data; len(rest) > 0; i++ {
			n := min(len(rest), len(buf))
			if i < len(cuts) {
				n = min(n, int(cuts[i])+1)
			}
			s.push(buf[:copy(buf, rest[:n])])
			for l, ok := s.next(); ok; l, ok = s.next() {
				got = append(got, l)
			}
			rest = rest[n:]
			if fed := s.fed(); fed != int64(len(data)-len(rest)) {
				t.Fatalf("fed() = %d after %d bytes", fed, len(data)-len(rest))
			}
		}
		want := ffSplitLines(data, limit)
		if len(got) != len(want) {
			t.Fatalf("%d lines, want %d", len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if !bytes.Equal(g.value, w.value) || g.value == nil || cap(g.value) != len(g.value) ||
				g.end != w.end || g.size != w.size || g.tooLong != w.tooLong {
				t.Fatalf("line %d = %+v, want %+v", i, g, w)
			}
		}
		if len(want) > 0 && s.pos != want[len(want)-1].end {
			t.Fatalf("pos = %d, want %d", s.pos, want[len(want)-1].end)
		}
	})
}

// ffSplitLines is the plain definition of the lines of data that
// lineSplitter must agree with.
func ffSplitLines(data []byte, limit int) []fileLine {
	var out []fileLine
	for end := 0; ; {
		i := bytes.IndexByte(data[end:], '\n')
		if i < 0 {
			return out
		}
		v := bytes.TrimSuffix(data[end:end+i], []byte("\r"))
		end += i + 1
		l := fileLine{value: v, end: int64(end), size: int64(len(v))}
		if len(v) > limit {
			l.value, l.tooLong = v[:limit], true
		}
		out = append(out, l)
	}
}

func TestFileFingerprint(t *testing.T) {
	long := bytes.Repeat([]byte("x"), fingerprintSize+10)
	for _, tc := range []struct {
		name   string
		prefix []byte
		same   []byte // nil: no fingerprint expected
	}{
		{"FirstLine", []byte("abc\ndef"), []byte("abc\n")},
		{"OnlyFirstLineCounts", []byte("abc\nxyz\n"), []byte("abc\n")},
		{"NoNewlineYet", []byte("abc"), nil},
		{"Empty", nil, nil},
		{"LongFirstLine", long, long[:fingerprintSize]},
		{"NewlineJustPastLimit", append(bytes.Repeat([]byte("y"), fingerprintSize), '\n'), bytes.Repeat([]byte("y"), fingerprintSize)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp, ok := fileFingerprint(tc.prefix)
			if tc.same == nil {
				if ok {
					t.Fatalf("fingerprint %q of %q, want none", fp, tc.prefix)
				}
				return
			}
			want, _ := fileFingerprint(tc.same)
			if !ok || fp != want || len(fp) != 16 {
				t.Fatalf("fingerprint = %q, %v; want %q", fp, ok, want)
			}
		})
	}
}

func TestFileEpoch(t *testing.T) {
	id := fileID{dev: 64769, ino: 1234, fp: "0123456789abcdef"}
	for _, tc := range []struct{ prev, want string }{
		{"", "64769:1234:0123456789abcdef"},
		{"64769:99:0123456789abcdef", "64769:1234:0123456789abcdef"},
		{"64769:1234:0123456789abcdef", "64769:1234:0123456789abcdef:t1"},
		{"64769:1234:fedcba9876543210:t4", "64769:1234:0123456789abcdef:t5"},
		{"1:1234:0123456789abcdef", "64769:1234:0123456789abcdef"},
		{"garbage", "64769:1234:0123456789abcdef"},
		{"64769:1234:0123456789abcdef:x1", "64769:1234:0123456789abcdef"},
	} {
		if got := nextFileEpoch(id, tc.prev); got != tc.want {
			t.Errorf("nextFileEpoch(after %q) = %q, want %q", tc.prev, got, tc.want)
		}
		e, ok := parseFileEpoch(tc.want)
		if !ok || e.String() != tc.want {
			t.Errorf("parseFileEpoch(%q) = %v, %v", tc.want, e, ok)
		}
	}
}
