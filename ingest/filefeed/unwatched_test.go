package filefeed

import (
	"fmt"
	"os"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
)

// ffCopyAway does what copytruncate does with a collector that ships the
// copy and deletes it at once: the file copied, truncated in place, and the
// copy gone before the feed can look at it.
func (ff *ffFile) copyAway() {
	ff.t.Helper()
	cpy := ff.copyTruncate(".1")
	if err := os.Remove(cpy); err != nil {
		ff.t.Fatal(err)
	}
}

// ffReadA opens a new feed on a new file holding "a\n" and reads its
// epoch and its item: where most scenarios here start. It returns the
// file, the feed and the epoch.
func ffReadA(t *testing.T, opts ...Options) (*ffFile, *Feed, string) {
	t.Helper()
	ff := ffNewFile(t)
	ff.write("a\n")
	f := ff.open(outbox.Checkpoint{}, opts...)
	e := ff.epoch()
	ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
	return ff, f, e
}

// expectStartedOver writes "x\n" into the truncated file and expects f to
// yield it first of the file's next life in place (epoch ":t1").
func (ff *ffFile) expectStartedOver(f *Feed) {
	ff.t.Helper()
	ff.write("x\n")
	e1 := ff.epoch() + ":t1"
	ffExpect(ff.t, f, ffEpochRec(e1), ffItem(e1, 2, "x"))
}

// expectNewFile writes "x\n" into a new file at the path and expects f to
// yield it first of the file's epoch after prev (the inode may be the
// deleted file's).
func (ff *ffFile) expectNewFile(f *Feed, prev string) {
	ff.t.Helper()
	ff.write("x\n")
	e2 := nextFileEpoch(ff.identity(), prev)
	ffExpect(ff.t, f, ffEpochRec(e2), ffItem(e2, 2, "x"))
}

// ffSawEnd waits until f has looked at its file and seen it end at end.
func ffSawEnd(t *testing.T, f *Feed, end int64) {
	t.Helper()
	ffNoMore(t, f) // polls: the feed looks at the file meanwhile
	testutil.Wait(t, ffTimeout, func() error {
		if got := f.Ends()[0]; got != end {
			ffNoMore(t, f)
			return fmt.Errorf("the feed saw its file end at %d, want %d", got, end)
		}
		return nil
	})
}

// TestFeed_Unwatched covers bytes written while the feed was not looking
// (not polled, as under SIGSTOP, or between two of its looks, or while the
// server was down) that vanished before it looked again: the file truncated
// with no copy left to read, or deleted while the server was down. The
// feed records a loss of unknown extent unless its evidence (the file's
// write events since its last look, the sizes it saw) rules unread bytes
// out; a file read to its end and truncated while watched stays lossless.
func TestFeed_Unwatched(t *testing.T) {
	// The feed is not polled between its last look and the next Poll: its
	// watcher meanwhile takes the file's events, as the kernel queues them
	// for a stopped process.
	t.Run("CopyTruncatedWhilePausedCopyCollected", func(t *testing.T) {
		t.Parallel()
		ff, f, e := ffReadA(t)
		ff.write("b\n") // written and gone unread
		ff.write("c\n")
		ff.copyAway()
		ff.write("x\n")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossUnseenTruncated), ffEpochRec(e1), ffItem(e1, 2, "x"))
	})
	t.Run("CopyTruncatedWhilePausedNothingWrittenSince", func(t *testing.T) {
		t.Parallel()
		ff, f, e := ffReadA(t)
		ff.write("b\n")
		ff.copyAway() // emptied: the write before the truncation is all that can explain its events
		ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossTruncated))
		ff.expectStartedOver(f)
	})
	t.Run("TruncatedBetweenTwoLooks", func(t *testing.T) {
		t.Parallel()
		ff, f, e := ffReadA(t)
		ff.write("b\n")
		ff.truncate(0)
		ff.write("x\n")
		ff.write("y\n")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossUnseenTruncated), ffEpochRec(e1),
			ffItem(e1, 2, "x"), ffItem(e1, 4, "y"))
	})
	t.Run("DeletedBetweenTwoLooks", func(t *testing.T) {
		t.Parallel()
		// The feed keeps the file open: what was written before the delete
		// is read, exactly, and nothing is lost.
		ff, f, e := ffReadA(t)
		ff.write("b\n")
		ff.write("cc\n")
		ff.remove()
		ffExpect(t, f, ffItem(e, 4, "b"), ffItem(e, 7, "cc"))
		ff.write("x\n")
		e2 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "x"))
	})
	t.Run("DeletedWhileDown", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		cp := outbox.Checkpoint{Epoch: e, Position: 4, End: 4} // every byte seen was read
		ff.write("c\n")                                        // after the last look: unread
		ff.remove()
		f := ff.open(cp)
		ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossVanished))
		ff.expectNewFile(f, e)
	})
	t.Run("DeletedWhileDownSeenUnread", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\nc\n")
		e := ff.epoch()
		ff.remove()
		// c was seen, not applied; more may have been written after.
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 4, End: 6})
		ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossVanished))
	})

	// Nothing written after the last read: the evidence rules a loss out.
	t.Run("FullyReadTruncatedWhileWatched", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"), ffItem(e, 4, "b"))
		ff.truncate(0)
		ffSawEnd(t, f, 0)
		ff.expectStartedOver(f)
	})
	t.Run("FullyReadCopyCollectedWhilePaused", func(t *testing.T) {
		t.Parallel()
		ff, f, _ := ffReadA(t)
		ffNoMore(t, f)
		ff.copyAway()
		ff.expectStartedOver(f) // one write after the truncation: all its events are accounted for
	})
	t.Run("FullyReadTruncatedThenWrittenWhileWeighed", func(t *testing.T) {
		t.Parallel()
		// A write lands while the feed waits for the truncation's events:
		// it is weighed with the bytes it adds, not taken for a write
		// before the truncation.
		ff, f, _ := ffReadA(t)
		f.mu.Lock()
		f.settling = func() { ff.write("x\n") }
		f.mu.Unlock()
		ff.truncate(0)
		recs := ffCollect(t, f, 2)
		e1 := ff.epoch() + ":t1"
		ffCheckCollected(t, recs, ffEpochRec(e1), ffItem(e1, 2, "x"))
		ffNoMore(t, f)
	})
	t.Run("FullyReadCopyCollectedEmpty", func(t *testing.T) {
		t.Parallel()
		ff, f, _ := ffReadA(t)
		ffNoMore(t, f)
		ff.copyAway()
		ffSawEnd(t, f, 0)
		ff.expectStartedOver(f)
	})

	// AssumeNoUnseenWrites: the operator vouches that nothing is written
	// while the feed does not look.
	t.Run("AssumeNoUnseenWrites", func(t *testing.T) {
		t.Parallel()
		ff, f, _ := ffReadA(t, Options{AssumeNoUnseenWrites: true})
		ff.write("b\n")
		ff.copyAway()
		ff.expectStartedOver(f)
	})
	t.Run("AssumeNoUnseenWritesDeletedWhileDown", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\nc\n")
		e := ff.epoch()
		ff.remove()
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 4, End: 6}, Options{AssumeNoUnseenWrites: true})
		ffExpect(t, f, ffLoss(e, 4, 6, LossReplaced))
		ff.expectNewFile(f, e)
	})
}
