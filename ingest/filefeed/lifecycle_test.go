package filefeed

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// identityOf returns the identity of the file name (plain, no generation).
func (ff *ffFile) identityOf(name string) fileID {
	ff.t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		ff.t.Fatal(err)
	}
	data, err := os.ReadFile(name)
	if err != nil {
		ff.t.Fatal(err)
	}
	id := fileIDOf(fi)
	fp, ok := fileFingerprint(data)
	if !ok {
		ff.t.Fatalf("%s has no fingerprint yet", name)
	}
	id.fp = fp
	return id
}

// epochOf returns the plain epoch of the file name.
func (ff *ffFile) epochOf(name string) string { return ff.identityOf(name).String() }

// rotate rotates the numbered way (logrotate's default, Python's
// RotatingFileHandler): every path.N becomes path.N+1, oldest first, then
// the path becomes path.1. The next write creates the path again.
func (ff *ffFile) rotate() {
	ff.t.Helper()
	n := 0
	for {
		if _, err := os.Stat(ff.path + "." + strconv.Itoa(n+1)); err != nil {
			break
		}
		n++
	}
	for ; n >= 1; n-- {
		if err := os.Rename(ff.path+"."+strconv.Itoa(n), ff.path+"."+strconv.Itoa(n+1)); err != nil {
			ff.t.Fatal(err)
		}
	}
	ff.rename(".1")
}

// copyTruncate does what logrotate's copytruncate does: copies the file to
// path+suffix, then truncates the file in place.
func (ff *ffFile) copyTruncate(suffix string) string {
	ff.t.Helper()
	data, err := os.ReadFile(ff.path)
	if err != nil {
		ff.t.Fatal(err)
	}
	to := ff.path + suffix
	if err := os.WriteFile(to, data, 0o644); err != nil {
		ff.t.Fatal(err)
	}
	ff.truncate(0)
	return to
}

// gzip compresses name to name.gz, keeping its modification time as gzip
// and logrotate do, and removes name.
func (ff *ffFile) gzip(name string) string {
	ff.t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		ff.t.Fatal(err)
	}
	in, err := os.Open(name)
	if err != nil {
		ff.t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(name + ".gz")
	if err != nil {
		ff.t.Fatal(err)
	}
	zw := gzip.NewWriter(out)
	if _, err := io.Copy(zw, in); err != nil {
		ff.t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		ff.t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		ff.t.Fatal(err)
	}
	if err := os.Chtimes(name+".gz", fi.ModTime(), fi.ModTime()); err != nil {
		ff.t.Fatal(err)
	}
	if err := os.Remove(name); err != nil {
		ff.t.Fatal(err)
	}
	return name + ".gz"
}

// gzEpochOf is the epoch of the compressed file name: its own device and
// inode, and the fingerprint of what it holds uncompressed.
func (ff *ffFile) gzEpochOf(name string) string {
	ff.t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		ff.t.Fatal(err)
	}
	f, err := os.Open(name)
	if err != nil {
		ff.t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		ff.t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		ff.t.Fatal(err)
	}
	id := fileIDOf(fi)
	fp, ok := fileFingerprint(data)
	if !ok {
		ff.t.Fatalf("%s holds no fingerprint", name)
	}
	id.fp = fp
	return id.String()
}

// touch sets the modification time of each name to at.
func (ff *ffFile) touch(at time.Time, names ...string) {
	ff.t.Helper()
	for _, n := range names {
		if err := os.Chtimes(n, at, at); err != nil {
			ff.t.Fatal(err)
		}
	}
}

// ffStoredAt is the checkpoint the loop stores at at.
func ffStoredAt(epoch string, pos, end int64, at time.Time) outbox.Checkpoint {
	return outbox.Checkpoint{Epoch: epoch, Position: pos, End: end, UpdatedAt: at.UnixNano()}
}

// ffClock is a clock a test moves by hand: the feed measures how long it
// was not looking at its file by it.
type ffClock struct{ now time.Time }

func (c *ffClock) Now() time.Time { return c.now }

// pause makes f believe it was not polled for d (as under SIGSTOP).
func ffPause(f *Feed, d time.Duration) *ffClock {
	c := &ffClock{now: time.Now()}
	f.mu.Lock()
	f.clock = c.Now
	if f.cur != nil {
		f.cur.lookedAt = c.now
	}
	f.mu.Unlock()
	c.now = c.now.Add(d)
	return c
}

// TestFeed_Generations follows the chains of generations rotation schemes
// leave beside the path, while stopped and while running.
func TestFeed_Generations(t *testing.T) {
	t.Run("NumberedWhileStopped", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a1\na2\n")
		e0 := ff.epoch()
		cp := ffStoredAt(e0, 3, 6, time.Now())
		ff.write("a3\n") // after the checkpoint: unread
		ff.rotate()
		ff.write("b1\nb2\n")
		e1 := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		e2 := ff.epoch()
		ff.rotate()
		ff.write("d1\n")
		e3 := ff.epoch()
		f := ff.open(cp)
		recs := ffExpect(t, f, ffItem(e0, 6, "a2"), ffItem(e0, 9, "a3"),
			ffEpochRec(e1), ffItem(e1, 3, "b1"), ffItem(e1, 6, "b2"),
			ffEpochRec(e2), ffItem(e2, 3, "c1"),
			ffEpochRec(e3), ffItem(e3, 3, "d1"))
		ffRestart(t, ff, recs[len(recs)-1])
	})
	t.Run("NumberedTiedTimes", func(t *testing.T) {
		t.Parallel()
		// Rotations faster than the file system's clock: every generation
		// has the same modification time, the suffix orders them.
		ff := ffNewFile(t)
		ff.write("a1\n")
		e0 := ff.epoch()
		cp := ffStoredAt(e0, 3, 3, time.Now())
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		e2 := ff.epoch()
		ff.rotate()
		ff.write("d1\n")
		e3 := ff.epoch()
		ff.rotate()
		ff.write("e1\n")
		e4 := ff.epoch()
		tie := time.Now().Add(time.Second)
		ff.touch(tie, ff.path+".1", ff.path+".2", ff.path+".3", ff.path+".4", ff.path)
		f := ff.open(cp)
		ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "c1"),
			ffEpochRec(e3), ffItem(e3, 3, "d1"), ffEpochRec(e4), ffItem(e4, 3, "e1"))
	})
	t.Run("TimesOrderBeforeNames", func(t *testing.T) {
		t.Parallel()
		// Distinct modification times order the generations whatever
		// their names say.
		ff := ffNewFile(t)
		ff.write("a1\n")
		e0 := ff.epoch()
		cp := ffStoredAt(e0, 3, 3, time.Now())
		older := ff.rename(".7")
		ff.write("b1\n")
		e1 := ff.epoch()
		newer := ff.rename(".9")
		ff.write("c1\n")
		e2 := ff.epoch()
		base := time.Now().Add(time.Second)
		ff.touch(base, older)
		ff.touch(base.Add(time.Second), newer)
		f := ff.open(cp)
		ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "c1"))
	})
	for _, scheme := range []struct{ name, sep string }{
		{"Dated", "-20261201"}, // logrotate's dateext
		{"DatedDots", ".2026-12-01"},
		{"DatedUnderscore", "_2026-12-01_13-00-00"},
	} {
		t.Run(scheme.name+"WhileStopped", func(t *testing.T) {
			t.Parallel()
			ff := ffNewFile(t)
			ff.write("a1\na2\n")
			e0 := ff.epoch()
			cp := ffStoredAt(e0, 3, 6, time.Now())
			first := ff.rename(scheme.sep)
			ff.write("b1\n")
			e1 := ff.epoch()
			second := ff.rename(scheme.sep[:len(scheme.sep)-1] + "9") // later the same day
			ff.write("c1\n")
			e2 := ff.epoch()
			ff.touch(time.Now().Add(time.Second), first, second, ff.path) // tied: the names order them
			f := ff.open(cp)
			recs := ffExpect(t, f, ffItem(e0, 6, "a2"), ffEpochRec(e1), ffItem(e1, 3, "b1"),
				ffEpochRec(e2), ffItem(e2, 3, "c1"))
			ffRestart(t, ff, recs[len(recs)-1])
		})
	}
	t.Run("SameHeaderInEveryGeneration", func(t *testing.T) {
		t.Parallel()
		// A CSV header starts every generation: later generations look
		// like copies of the checkpoint's file, and are not taken for one.
		ff := ffNewFile(t)
		ff.write("acct,amt\na,1\n")
		e0 := ff.epoch()
		at := time.Now()
		cp := ffStoredAt(e0, 13, 13, at)
		ff.write("b,2\n")
		ff.rotate()
		ff.write("acct,amt\nc,3\nd,4\n")
		ff.rotate()
		ff.write("acct,amt\ne,5\n")
		ff.touch(at.Add(time.Second), ff.path+".1", ff.path+".2", ff.path)
		e1, e2 := ff.epochOf(ff.path+".1"), ff.epoch()
		f := ff.open(cp)
		ffExpect(t, f, ffItem(e0, 17, "b,2"), ffEpochRec(e1), ffItem(e1, 9, "acct,amt"), ffItem(e1, 13, "c,3"), ffItem(e1, 17, "d,4"),
			ffEpochRec(e2), ffItem(e2, 9, "acct,amt"), ffItem(e2, 13, "e,5"))
	})
	t.Run("ReadGenerationsNotReadAgain", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a1\n")
		ff.rotate() // read to its end before the checkpoint
		ff.write("b1\nb2\n")
		e1 := ff.epoch()
		cp := ffStoredAt(e1, 3, 6, time.Now())
		ff.rotate()
		ff.write("c1\n")
		e2 := ff.epoch()
		ff.touch(time.Now().Add(time.Second), ff.path+".1", ff.path+".2", ff.path) // tied
		f := ff.open(cp)
		ffExpect(t, f, ffItem(e1, 6, "b2"), ffEpochRec(e2), ffItem(e2, 3, "c1"))
	})
	t.Run("SeveralRotationsBetweenPolls", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		e0 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e0), ffItem(e0, 3, "a1"))
		// No Poll runs: the feed does not look until the next one.
		ff.write("a2\n")
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		ff.write("c1\nc2\n")
		e2 := ff.epoch()
		ff.rotate()
		ff.write("d1\n")
		e3 := ff.epoch()
		recs := ffExpect(t, f, ffItem(e0, 6, "a2"), ffEpochRec(e1), ffItem(e1, 3, "b1"),
			ffEpochRec(e2), ffItem(e2, 3, "c1"), ffItem(e2, 6, "c2"), ffEpochRec(e3), ffItem(e3, 3, "d1"))
		// And again, with the generation read last renamed on the way.
		ff.rotate()
		ff.write("e1\n")
		e4 := ff.epoch()
		ff.rotate()
		ff.write("f1\n")
		e5 := ff.epoch()
		recs = ffExpect(t, f, ffEpochRec(e4), ffItem(e4, 3, "e1"), ffEpochRec(e5), ffItem(e5, 3, "f1"))
		ffRestart(t, ff, recs[len(recs)-1])
	})
	t.Run("RotatedGenerationDeletedWhileRead", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		e0 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e0), ffItem(e0, 3, "a1"))
		ff.write("a2\n")
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		if err := os.Remove(ff.path + ".2"); err != nil { // rotate 1: the oldest goes, still open here
			t.Fatal(err)
		}
		ff.write("c1\n")
		e2 := ff.epoch()
		ffExpect(t, f, ffItem(e0, 6, "a2"), ffEpochRec(e1), ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "c1"))
	})
	t.Run("OpenFileDeletedBeforeItsTurn", func(t *testing.T) {
		t.Parallel()
		// The feed opened the file at the path while a generation before it
		// was still to read; that file is then rotated away and deleted
		// before its turn: it is read from the open file.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		e0 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e0), ffItem(e0, 3, "a1"))
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		e2 := ff.epoch()
		if got := ffDescribeAll(ffCollect(t, f, 1)); got[0] != ffEpochRec(e1) {
			t.Fatalf("got %v, want the epoch of the generation after the first", got)
		}
		ff.rotate()
		ff.touch(time.Now().Add(time.Second), ff.path+".1", ff.path+".2") // tied with the generation read
		if err := os.Remove(ff.path + ".1"); err != nil {
			t.Fatal(err)
		}
		ff.write("d1\n")
		e3 := nextFileEpoch(ff.identity(), e2)
		ffExpect(t, f, ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "c1"), ffEpochRec(e3), ffItem(e3, 3, "d1"))
	})
	t.Run("OpenFileTruncatedBeforeItsTurn", func(t *testing.T) {
		t.Parallel()
		// The feed opened the file at the path while a generation before it
		// was still to read; that file is then copied and truncated: its
		// copy holds what it had, read in the copy's identity, and the file
		// is read with what it holds now.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		e0 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e0), ffItem(e0, 3, "a1"))
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		if got := ffDescribeAll(ffCollect(t, f, 1)); got[0] != ffEpochRec(e1) {
			t.Fatalf("got %v, want the epoch of the generation after the first", got)
		}
		ff.rotateCopies()
		cpy := ff.copyTruncate(".1")
		ff.write("dd1\n")
		eCopy, e2 := ff.epochOf(cpy), ff.epoch()
		ffExpect(t, f, ffItem(e1, 3, "b1"), ffEpochRec(eCopy), ffItem(eCopy, 3, "c1"), ffEpochRec(e2), ffItem(e2, 4, "dd1"))
	})
	t.Run("DeletedGeneration", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a1\na2\n")
		e0 := ff.epoch()
		at := time.Now()
		cp := ffStoredAt(e0, 3, 6, at) // a2 seen, not applied
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		if err := os.Remove(ff.path + ".2"); err != nil { // the checkpoint's file aged out
			t.Fatal(err)
		}
		ff.write("c1\n")
		e2 := ff.epoch()
		ff.touch(at.Add(time.Second), ff.path+".1", ff.path)
		f := ff.open(cp)
		ffExpect(t, f, ffLoss(e0, 3, ingest.UnknownPosition, LossVanished), ffEpochRec(e1), ffItem(e1, 3, "b1"),
			ffEpochRec(e2), ffItem(e2, 3, "c1"))
	})
	t.Run("DeletedGenerationEverythingRead", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a1\n")
		e0 := ff.epoch()
		at := time.Now()
		cp := ffStoredAt(e0, 3, 3, at)
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		if err := os.Remove(ff.path + ".2"); err != nil {
			t.Fatal(err)
		}
		old := ff.path + ".old" // not a generation's name: never read
		ff.write("x1\n", old)
		ff.touch(at.Add(-time.Hour), old)
		ff.write("c1\n")
		e2 := ff.epoch()
		ff.touch(at.Add(time.Second), ff.path+".1", ff.path)
		f := ff.open(cp)
		// Every byte seen was read, but a1's file may have been written
		// again before it was rotated away: that cannot be ruled out.
		ffExpect(t, f, ffLoss(e0, 3, ingest.UnknownPosition, LossVanished),
			ffEpochRec(e1), ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "c1"))
	})
	t.Run("OlderGenerationsWhenTheFileIsGone", func(t *testing.T) {
		t.Parallel()
		// The checkpoint's file was replaced; the generations beside it
		// are older than the checkpoint: read before, not again.
		ff := ffNewFile(t)
		ff.write("a1\n")
		ff.rotate()
		ff.write("b1\n")
		ff.rotate()
		ff.touch(time.Now().Add(-time.Hour), ff.path+".1", ff.path+".2")
		ff.write("c1\nc2\n")
		e0 := ff.epoch()
		cp := ffStoredAt(e0, 6, 6, time.Now())
		ff.remove()
		ff.write("d1\n")
		e1 := nextFileEpoch(ff.identity(), e0) // the new file may have the old one's inode
		f := ff.open(cp)
		ffExpect(t, f, ffLoss(e0, 6, ingest.UnknownPosition, LossVanished), ffEpochRec(e1), ffItem(e1, 3, "d1"))
	})
	t.Run("CompressedCheckpointFile", func(t *testing.T) {
		t.Parallel()
		// compress + delaycompress: the checkpoint's file is compressed at
		// the second rotation; it cannot be read, so its rest is lost.
		ff := ffNewFile(t)
		ff.write("a1\na2\n")
		e0 := ff.epoch()
		cp := ffStoredAt(e0, 3, 3, time.Now().Add(-time.Second))
		ff.rotate()
		ff.write("b1\n")
		e1 := ff.epoch()
		ff.rotate()
		ff.gzip(ff.path + ".2")
		ff.write("c1\n")
		e2 := ff.epoch()
		f := ff.open(cp)
		ffExpect(t, f, ffLoss(e0, 3, ingest.UnknownPosition, LossCompressed),
			ffEpochRec(e1), ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "c1"))
	})
	t.Run("CompressedLaterGeneration", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		e0 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e0), ffItem(e0, 3, "a1"))
		ff.rotate()
		ff.write("b1\n")
		ff.rotate()
		gz := ff.gzip(ff.path + ".1") // compressed at once: never read
		ff.write("c1\n")
		e2 := ff.epoch()
		ffExpect(t, f, ffLoss(ff.gzEpochOf(gz), 0, ingest.UnknownPosition, LossCompressed),
			ffEpochRec(e2), ffItem(e2, 3, "c1"))
	})
	t.Run("CompressedCopyOfTheFileRead", func(t *testing.T) {
		t.Parallel()
		// The file the feed reads is rotated and compressed while it reads
		// it: it reads its open file to the end, and the compressed copy
		// is no loss.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		e0 := ff.epoch()
		ffExpect(t, f, ffEpochRec(e0), ffItem(e0, 3, "a1"))
		ff.write("a2\n")
		ff.gzip(ff.rename(".1"))
		ff.write("b1\n")
		e1 := ff.epoch()
		ffExpect(t, f, ffItem(e0, 6, "a2"), ffEpochRec(e1), ffItem(e1, 3, "b1"))
	})
}

// TestFeed_Replaced covers a file replaced by another while the feed was
// stopped: a loss only where bytes were seen and not read.
func TestFeed_Replaced(t *testing.T) {
	t.Run("SameFirstLine", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		ff.write("a\nb\nc\n", ff.path+".new")
		if err := os.Rename(ff.path+".new", ff.path); err != nil {
			t.Fatal(err)
		}
		e2 := ff.epoch()
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 4, End: 4})
		// The old file is gone: what was written to it after the last look
		// cannot be ruled out. The new file is read whole.
		recs := ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossVanished),
			ffEpochRec(e2), ffItem(e2, 2, "a"), ffItem(e2, 4, "b"), ffItem(e2, 6, "c"))
		ffRestart(t, ff, recs[4])
	})
	t.Run("UnreadBytesLost", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\nc\n")
		e := ff.epoch()
		ff.write("a\n", ff.path+".new")
		if err := os.Rename(ff.path+".new", ff.path); err != nil {
			t.Fatal(err)
		}
		e2 := ff.epoch()
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 4, End: 6})
		ffExpect(t, f, ffLoss(e, 4, ingest.UnknownPosition, LossVanished), ffEpochRec(e2), ffItem(e2, 2, "a"))
	})
	t.Run("InodeReusedAnotherFirstLine", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("new\nfile\n")
		id := ff.identity()
		stored := fileID{dev: id.dev, ino: id.ino, fp: "00000000deadbeef"}.String()
		f := ff.open(outbox.Checkpoint{Epoch: stored, Position: 4, End: 4})
		e1 := id.String() + ":t1"
		recs := ffExpect(t, f, ffLoss(stored, 4, ingest.UnknownPosition, LossUnseenTruncated),
			ffEpochRec(e1), ffItem(e1, 4, "new"), ffItem(e1, 9, "file"))
		ffRestart(t, ff, recs[3])
	})
	t.Run("InodeReusedSameFirstLine", func(t *testing.T) {
		t.Parallel()
		// The old file had "h\nxx\n" and the checkpoint stood at 5; the new
		// file on its inode has the same first line, and no line ends at 5.
		ff := ffNewFile(t)
		ff.write("h\nyyyy\n")
		e := ff.epoch()
		f := ff.open(outbox.Checkpoint{Epoch: e, Position: 5, End: 5})
		e1 := e + ":t1"
		ffExpect(t, f, ffLoss(e, 5, ingest.UnknownPosition, LossUnseenTruncated),
			ffEpochRec(e1), ffItem(e1, 2, "h"), ffItem(e1, 7, "yyyy"))
	})
}

// TestFeed_CopyTruncate covers logrotate's copytruncate: the rest of the
// file is read from the copy, in the file's epoch; without a copy, the loss
// has an unknown extent.
func TestFeed_CopyTruncate(t *testing.T) {
	t.Run("WhileStopped", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		cp := ffStoredAt(e, 2, 4, time.Now())
		ff.write("c\n")
		ff.copyTruncate(".1")
		f := ff.open(cp)
		ffExpect(t, f, ffItem(e, 4, "b"), ffItem(e, 6, "c"))
		ff.write("d\n")
		e1 := ff.epoch() + ":t1" // the same inode, another first line
		recs := ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 2, "d"))
		ffRestart(t, ff, recs[1])
	})
	t.Run("WhileStoppedRegrown", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		cp := ffStoredAt(e, 2, 4, time.Now())
		ff.copyTruncate(".1")
		ff.write("dd\nee\nff\n") // past the position, another first line
		e1 := ff.epoch() + ":t1"
		f := ff.open(cp)
		ffExpect(t, f, ffItem(e, 4, "b"), ffEpochRec(e1), ffItem(e1, 3, "dd"), ffItem(e1, 6, "ee"), ffItem(e1, 9, "ff"))
	})
	t.Run("WhileStoppedRegrownSameFirstLine", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("h\nx\n") // a header line
		e := ff.epoch()
		cp := ffStoredAt(e, 4, 4, time.Now())
		ff.write("y\n")
		ff.copyTruncate(".1")
		ff.write("h\nzz\n") // past the position, no line ends there
		f := ff.open(cp)
		e1 := e + ":t1"
		ffExpect(t, f, ffItem(e, 6, "y"), ffEpochRec(e1), ffItem(e1, 2, "h"), ffItem(e1, 5, "zz"))
	})
	t.Run("WhileStoppedNoCopy", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		ff.truncate(0)
		ff.write("x\n")
		f := ff.open(ffStoredAt(e, 2, 2, time.Now()))
		e1 := ff.epoch() + ":t1"
		recs := ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossUnseenTruncated), ffEpochRec(e1), ffItem(e1, 2, "x"))
		ffRestart(t, ff, recs[2])
	})
	t.Run("TwiceWhileStopped", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("h\na\n")
		e := ff.epoch()
		at := time.Now()
		cp := ffStoredAt(e, 4, 4, at)
		ff.write("b\n")
		ff.copyTruncate(".1")
		ff.write("h\nc\n")
		ff.rotateCopies()
		second := ff.copyTruncate(".1")
		ff.write("h\nd\n")
		ff.touch(at.Add(time.Second), ff.path+".2")
		ff.touch(at.Add(2*time.Second), second)
		eB := ff.epochOf(second)
		e1 := e + ":t1"
		f := ff.open(cp)
		ffExpect(t, f, ffItem(e, 6, "b"), ffEpochRec(eB), ffItem(eB, 2, "h"), ffItem(eB, 4, "c"),
			ffEpochRec(e1), ffItem(e1, 2, "h"), ffItem(e1, 4, "d"))
	})
	t.Run("ThenRotatedWhileStopped", func(t *testing.T) {
		t.Parallel()
		// copytruncate, then the file renamed away by a rotation of the
		// other kind: the checkpoint's inode is a generation now, holding
		// later lines; its copy holds the rest of the checkpoint's epoch.
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		e := ff.epoch()
		at := time.Now()
		cp := ffStoredAt(e, 2, 4, at)
		ff.write("c\n")
		ff.copyTruncate(".1")
		ff.write("dd\n")
		ff.rotate() // app.log.1 (the copy) -> .2, app.log -> .1
		ff.write("eee\n")
		ff.touch(at.Add(time.Second), ff.path+".2")
		ff.touch(at.Add(2*time.Second), ff.path+".1")
		e1 := ff.epochOf(ff.path+".1") + ":t1"
		e2 := ff.epoch()
		f := ff.open(cp)
		ffExpect(t, f, ffItem(e, 4, "b"), ffItem(e, 6, "c"), ffEpochRec(e1), ffItem(e1, 3, "dd"),
			ffEpochRec(e2), ffItem(e2, 4, "eee"))
	})
	t.Run("OlderCopiesNotRead", func(t *testing.T) {
		t.Parallel()
		// Copies of earlier epochs, read before the checkpoint, hold the
		// same first line and a line end at the position: not read again.
		ff := ffNewFile(t)
		ff.write("h\np\nq\n")
		ff.copyTruncate(".1")
		ff.touch(time.Now().Add(-time.Hour), ff.path+".1")
		ff.write("h\na\n")
		e := ff.epoch() // the generation after the truncation, as resumed here
		at := time.Now()
		cp := ffStoredAt(e, 4, 4, at)
		ff.write("b\n")
		ff.rotateCopies()
		c := ff.copyTruncate(".1")
		ff.touch(at.Add(time.Second), c)
		ff.write("x\n")
		f := ff.open(cp)
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffItem(e, 6, "b"), ffEpochRec(e1), ffItem(e1, 2, "x"))
	})
	t.Run("WhileRunningUnread", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		ff.write("b\nc\n")
		ff.copyTruncate(".1")
		ffExpect(t, f, ffItem(e, 4, "b"), ffItem(e, 6, "c"))
		ff.write("d\n")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 2, "d"))
	})
	t.Run("WhileRunningRegrown", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\nb\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"), ffItem(e, 4, "b"))
		ff.write("c\n")
		ff.copyTruncate(".1")
		ff.write("a\nxx\nlonger\n") // the same first line, past the position
		e1 := e + ":t1"
		ffExpect(t, f, ffItem(e, 6, "c"), ffEpochRec(e1), ffItem(e1, 2, "a"), ffItem(e1, 5, "xx"), ffItem(e1, 12, "longer"))
	})
	t.Run("BetweenTwoReads", func(t *testing.T) {
		t.Parallel()
		// Truncated and written again past the read position while the
		// feed was between two reads of the file (it had not reached its
		// end): the bytes of the second read are not taken for the file's.
		ff := ffNewFile(t)
		var old strings.Builder
		for i := 0; old.Len() < 2*fileReadSize; i++ {
			fmt.Fprintf(&old, "old line %06d\n", i)
		}
		ff.write(old.String())
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		first := ffCollect(t, f, 2) // the epoch and one line: the rest of the first read waits
		if got := ffDescribe(first[1]); got != ffItem(e, 16, "old line 000000") {
			t.Fatalf("got %s", got)
		}
		ff.copyTruncate(".1")
		var regrown strings.Builder
		for i := 0; regrown.Len() < 3*fileReadSize; i++ {
			fmt.Fprintf(&regrown, "new %06d\n", i)
		}
		ff.write(regrown.String())
		e1 := ff.epoch() + ":t1"
		n := old.Len()/16 - 1 + 1 + regrown.Len()/11
		recs := ffCollect(t, f, n)
		for i, r := range recs {
			var want string
			switch j := i + 1; {
			case j < old.Len()/16:
				want = ffItem(e, int64(16*(j+1)), fmt.Sprintf("old line %06d", j))
			case j == old.Len()/16:
				want = ffEpochRec(e1)
			default:
				k := j - old.Len()/16 - 1
				want = ffItem(e1, int64(11*(k+1)), fmt.Sprintf("new %06d", k))
			}
			if got := ffDescribe(r); got != want {
				t.Fatalf("record %d: got %s, want %s", i, got, want)
			}
		}
		ffNoMore(t, f)
	})
	t.Run("CopyOfTheNextEpochWhileReadingACopy", func(t *testing.T) {
		t.Parallel()
		// While the feed reads the rest of one epoch from its copy, the
		// next copytruncate copies the file again and has not truncated it
		// yet: that copy holds the file's own lines, read from the file.
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		ff.write("b\nb2\n")
		ff.copyTruncate(".1")
		ff.write("c\n")
		if got := ffDescribeAll(ffCollect(t, f, 1)); got[0] != ffItem(e, 4, "b") {
			t.Fatalf("got %v, want b from the copy", got)
		}
		ff.rotateCopies()
		data, err := os.ReadFile(ff.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(ff.path+".1", data, 0o644); err != nil { // copied, not truncated yet
			t.Fatal(err)
		}
		ff.touch(time.Now().Add(time.Second), ff.path+".1")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffItem(e, 7, "b2"), ffEpochRec(e1), ffItem(e1, 2, "c"))
	})
	t.Run("WhileRunningUnterminated", func(t *testing.T) {
		t.Parallel()
		// Copied and truncated in the middle of a line: the copy's last
		// bytes are the start of a line whose end went to the file's next
		// life. They were truncated before they were read, not rotated.
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		ff.write("b\npart")
		ff.copyTruncate(".1")
		ff.write("x\n")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffItem(e, 4, "b"), ffLoss(e, 4, 8, LossCutByTruncation), ffEpochRec(e1), ffItem(e1, 2, "x"))
	})
	t.Run("WhilePaused", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		ffPause(f, time.Minute)
		ff.write("b\n")
		ff.copyTruncate(".1")
		ffExpect(t, f, ffItem(e, 4, "b"))
	})
	t.Run("WhilePausedNoCopy", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		ffPause(f, time.Minute)
		ff.write("b\n") // never seen: the feed was not looking
		ff.truncate(0)
		ff.write("x\n")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossUnseenTruncated), ffEpochRec(e1), ffItem(e1, 2, "x"))
	})
	t.Run("WhileRunningNoCopyUnread", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f := ff.open(outbox.Checkpoint{})
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		ff.write("unfinished")
		ffNoMore(t, f) // seen, not a line yet
		ff.truncate(0)
		ff.write("x\n")
		e1 := ff.epoch() + ":t1"
		ffExpect(t, f, ffLoss(e, 2, ingest.UnknownPosition, LossTruncated), ffEpochRec(e1), ffItem(e1, 2, "x"))
	})
}

// rotateCopies shifts the numbered copies up by one, oldest first, so a new
// copy can be made at path.1.
func (ff *ffFile) rotateCopies() {
	ff.t.Helper()
	n := 0
	for {
		if _, err := os.Stat(ff.path + "." + strconv.Itoa(n+1)); err != nil {
			break
		}
		n++
	}
	for ; n >= 1; n-- {
		if err := os.Rename(ff.path+"."+strconv.Itoa(n), ff.path+"."+strconv.Itoa(n+1)); err != nil {
			ff.t.Fatal(err)
		}
	}
}

func TestGenerationName(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ok         bool
		compressed bool
	}{
		{"app.log.1", true, false},
		{"app.log.12", true, false},
		{"app.log.1.gz", true, true},
		{"app.log-20261201", true, false},
		{"app.log-20261201.gz", true, true},
		{"app.log.2026-12-01", true, false},
		{"app.log_2026-12-01_13-00-00", true, false},
		{"app.log-20261201-1764590000.xz", true, true},
		{"app.log.2026-12-01T13:00:00", true, false},
		{"app.log", false, false},
		{"app.log.", false, false},
		{"app.log.gz", false, false},
		{"app.log.bak", false, false},
		{"app.log.1.other", false, false},
		{"app.log.swp", false, false},
		{"app.logs.1", false, false},
		{"xapp.log.1", false, false},
		{"app.log1", false, false},
	} {
		_, compressed, ok := generationSuffix("app.log", tc.name)
		if ok != tc.ok || compressed != tc.compressed {
			t.Errorf("generationSuffix(%q) = compressed %v, ok %v; want %v, %v", tc.name, compressed, ok, tc.compressed, tc.ok)
		}
	}
}

func TestGenerationOrder(t *testing.T) {
	at := time.Unix(1764590000, 0)
	gen := func(name string, mtime time.Time) generation {
		r, c, ok := generationSuffix("app.log", name)
		if !ok {
			t.Fatalf("%s is not a generation", name)
		}
		return generation{name: name, mtime: mtime, rank: r, compressed: c}
	}
	for _, tc := range []struct {
		older, newer generation
	}{
		{gen("app.log.1", at), gen("app.log.2", at.Add(time.Millisecond))}, // times first
		{gen("app.log.2", at), gen("app.log.1", at)},                       // tied: higher number is older
		{gen("app.log.10", at), gen("app.log.9", at)},
		{gen("app.log.3.gz", at), gen("app.log.2", at)},
		{gen("app.log-20261201", at), gen("app.log-20261202", at)}, // tied: dates in order
		{gen("app.log.2026-12-01", at), gen("app.log.2026-12-01_13-00", at)},
		{gen("app.log.2", at), gen("app.log-20261201", at)}, // numbered before dated
	} {
		if !tc.older.before(tc.newer) || tc.newer.before(tc.older) {
			t.Errorf("%s (%v) should come before %s (%v)", tc.older.name, tc.older.mtime, tc.newer.name, tc.newer.mtime)
		}
	}
}

// TestFeed_RotationRaces plays, deterministically, the moments of a
// rotation storm at which the feed looks: through its listing function, the
// test lists or writes at the instant the feed lists the generations.
func TestFeed_RotationRaces(t *testing.T) {
	t.Run("ListingsThatDisagree", func(t *testing.T) {
		t.Parallel()
		// Renames move a generation past the directory reader: listings
		// taken back to back show it in one and not in the next. The one
		// that hides it must not be taken for the chain, or the generation
		// is passed over for good, with no loss recorded.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rotate()
		ff.write("b1\n")
		b := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		c := ff.epoch()
		hidden := ff.identityOf(ff.path + ".1")
		calls := 0
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			gens, err := listGenerationsOnce(path)
			calls++
			if calls <= 2*listTries && calls%2 == 1 {
				gens = slices.DeleteFunc(gens, func(g generation) bool { return g.id.sameInode(hidden) })
			}
			return gens, err
		}
		f.mu.Unlock()
		ffExpect(t, f, ffEpochRec(b), ffItem(b, 3, "b1"), ffEpochRec(c), ffItem(c, 3, "c1"))
		if calls <= 2*listTries {
			t.Fatalf("%d listings: the test did not play listings that disagree", calls)
		}
	})
	t.Run("ListingsNeverSettle", func(t *testing.T) {
		t.Parallel()
		// While listings keep disagreeing, the feed moves nowhere (neither
		// past the generation it cannot be sure of nor to the path), and
		// goes on once they agree.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rotate()
		ff.write("b1\n")
		b := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		c := ff.epoch()
		hidden := ff.identityOf(ff.path + ".1")
		var settled atomic.Bool
		calls := 0
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			gens, err := listGenerationsOnce(path)
			calls++
			if !settled.Load() && calls%2 == 1 {
				gens = slices.DeleteFunc(gens, func(g generation) bool { return g.id.sameInode(hidden) })
			}
			return gens, err
		}
		f.mu.Unlock()
		ffNoMore(t, f)
		settled.Store(true)
		ffExpect(t, f, ffEpochRec(b), ffItem(b, 3, "b1"), ffEpochRec(c), ffItem(c, 3, "c1"))
	})
	for _, pos := range []int64{0, 3} {
		t.Run(fmt.Sprintf("CopiedBeforeTheCheckpointAt%d", pos), func(t *testing.T) {
			t.Parallel()
			// The feed saw 3 bytes of the file; the writer went on, and
			// copied and truncated it before the checkpoint (at pos) was
			// stored; then the server was killed. The copy is older than
			// the checkpoint and longer than what it saw, but it is the
			// only copy: the rest of the epoch is read from it.
			ff := ffNewFile(t)
			ff.write("a1\n")
			a := ff.epoch()
			ff.write("a2\n")
			cpy := ff.copyTruncate(".1")
			ff.write("b1\n")
			stored := time.Now()
			ff.touch(stored.Add(-time.Second), cpy)
			f := ff.open(ffStoredAt(a, pos, 3, stored))
			b := nextFileEpoch(ff.identity(), a)
			var want []string
			if pos == 0 {
				want = append(want, ffItem(a, 3, "a1"))
			}
			ffExpect(t, f, append(want, ffItem(a, 6, "a2"), ffEpochRec(b), ffItem(b, 3, "b1"))...)
		})
	}
	t.Run("NextFileCopiedAndTruncatedWhileTheFeedLooks", func(t *testing.T) {
		t.Parallel()
		// The feed has the file at the path open as the next one while a
		// generation before it is read; the file is copied and truncated
		// (and written again) after the feed listed the generations and
		// before it moves to the file: what the file held when the feed
		// opened it is read from the copy, then what it holds now.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rotate()
		ff.write("b1\n")
		b := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		if got := ffDescribeAll(ffCollect(t, f, 1)); got[0] != ffEpochRec(b) {
			t.Fatalf("got %v, want the epoch of the generation after the first", got)
		}
		calls, cpy := 0, ""
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			gens, err := listGenerationsOnce(path)
			if calls++; calls == 2 { // the listing that settles the chain
				ff.rotateCopies()
				cpy = ff.copyTruncate(".1")
				ff.write("dd1\n")
			}
			return gens, err
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 5))
		if cpy == "" {
			t.Fatal("the feed never listed the generations: the test did not copy while it looked")
		}
		eCopy, e2 := ff.epochOf(cpy), ff.epoch()
		ffCheckRecords(t, got, ffItem(b, 3, "b1"), ffEpochRec(eCopy), ffItem(eCopy, 3, "c1"), ffEpochRec(e2), ffItem(e2, 4, "dd1"))
		ffNoMore(t, f)
	})
	t.Run("CopyBeingWritten", func(t *testing.T) {
		t.Parallel()
		// The feed finds the path empty after a rotation and lists the
		// generations just as the next file, already written, is being
		// copied (copytruncate): the copy is there, still empty. It is
		// waited for, not passed over as a file that never had a line; by
		// the next look the copy is written and the file truncated and
		// written again.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rename(".1")
		calls := 0
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			switch calls++; calls {
			case 1:
				ff.write("b1\n")
				ff.rotateCopies()
				ff.write("", ff.path+".1")
			case 3:
				ff.write("b1\n", ff.path+".1")
				ff.truncate(0)
				ff.write("c1\n")
			}
			return listGenerationsOnce(path)
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 4))
		eCopy, c := ff.epochOf(ff.path+".1"), ff.epoch()
		ffCheckRecords(t, got, ffEpochRec(eCopy), ffItem(eCopy, 3, "b1"), ffEpochRec(c), ffItem(c, 3, "c1"))
		ffNoMore(t, f)
	})
	t.Run("WrittenWhileTheFeedLooks", func(t *testing.T) {
		t.Parallel()
		// logrotate's create: the file is renamed and an empty one made at
		// the path; the writer puts its last line into the renamed file and
		// then its first one into the new file, while the feed is between
		// its look at the old file and its move to the new one.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		old := ff.rename(".1")
		ff.write("")
		fi, err := os.Stat(ff.path)
		if err != nil {
			t.Fatal(err)
		}
		next := fileIDOf(fi)
		next.fp, _ = fileFingerprint([]byte("b1\n"))
		b := next.String()
		wrote := false
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			if !wrote {
				wrote = true
				ff.write("a2\n", old)
				ff.write("b1\n")
			}
			return listGenerationsOnce(path)
		}
		f.mu.Unlock()
		ffExpect(t, f, ffItem(a, 6, "a2"), ffEpochRec(b), ffItem(b, 3, "b1"))
		if !wrote {
			t.Fatal("the feed never listed the generations: the test did not write while it looked")
		}
	})
	t.Run("NextFileOpenedEmptyCopiedAndTruncatedAfterTheMatch", func(t *testing.T) {
		t.Parallel()
		// The feed opened the next file while it was still empty (the
		// writer had created it and not yet written). By its next look the
		// file holds b1 and a copy of it is there, not yet truncated: the
		// copy's lines are left to the file. The file is then truncated and
		// written again after that match, before the feed moves to it:
		// b1 is read from the copy, then what the file holds now.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rename(".1")
		ff.write("")
		ffNoMore(t, f)
		f.mu.Lock()
		opened := f.next != nil && f.next.id.fp == ""
		f.mu.Unlock()
		if !opened {
			t.Fatal("the feed did not open the empty next file: the test did not play its race")
		}
		ff.write("b1\n")
		ff.rotateCopies()
		cpy := ff.path + ".1"
		ff.write("b1\n", cpy)
		looks := 0
		f.mu.Lock()
		f.looking = func(s *fileSource, fingerprinted bool) {
			if !fingerprinted {
				if looks++; looks == 2 { // after the match, before the move
					ff.truncate(0)
					ff.write("c1\n")
				}
			}
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 4))
		if looks < 2 {
			t.Fatalf("%d looks at the next file: the test did not truncate between the match and the move", looks)
		}
		eCopy, c := ff.epochOf(cpy), ff.epoch()
		ffCheckRecords(t, got, ffEpochRec(eCopy), ffItem(eCopy, 3, "b1"), ffEpochRec(c), ffItem(c, 3, "c1"))
		ffNoMore(t, f)
	})
	t.Run("NextFileCopiedAndTruncatedTwiceBeforeTheMove", func(t *testing.T) {
		t.Parallel()
		// copytruncate runs twice before the feed gets to the next file,
		// opened when it held b1: b1's copy is read as a generation; b2's
		// copy is made while the file still holds b2, and left to the file;
		// then the file is truncated and written again (b3) before the feed
		// moves to it. b2 is read from its copy: the copy of the life the
		// file was opened with is not the only one to look for.
		ff := ffNewFile(t)
		f, next := ffNextFileOpenedWithB1(t, ff)
		f.mu.Lock()
		opened := f.next != nil && f.next.id.sameInode(next)
		f.mu.Unlock()
		if !opened {
			t.Fatal("the feed did not open the next file while it held b1: the test did not play its race")
		}
		ff.rotateCopies()
		ff.copyTruncate(".1")
		ff.write("b2\n")
		ff.rotateCopies()
		second := ff.path + ".1"
		ff.write("b2\n", second)
		firstID := ff.identityOf(ff.path + ".2")
		looks := 0
		f.mu.Lock()
		f.looking = func(s *fileSource, fingerprinted bool) {
			if fingerprinted || !s.id.sameInode(next) || f.cur == nil || !f.cur.id.sameInode(firstID) {
				return
			}
			if looks++; looks == 2 { // after the match with b2's copy, before the move
				ff.truncate(0)
				ff.write("b3\n")
			}
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 6))
		if looks < 2 {
			t.Fatalf("%d looks at the next file after b1's copy: the test did not truncate between the match and the move", looks)
		}
		e1, e2, e3 := firstID.String(), ff.epochOf(second), ff.epoch()
		ffCheckRecords(t, got, ffEpochRec(e1), ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "b2"), ffEpochRec(e3), ffItem(e3, 3, "b3"))
		ffNoMore(t, f)
	})
	t.Run("NextFileCopiedAndTruncatedWhileItIsLookedAt", func(t *testing.T) {
		t.Parallel()
		// The next file is copied, truncated and written again (a longer
		// line) just after the feed read its fingerprint as it moves to it: the
		// size and time it goes on with are those of the file it
		// fingerprinted, so the copy is found when the truncation is seen,
		// and b1 is read from it, not reported lost.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rename(".1")
		ff.write("b1\n")
		b := ff.epoch()
		done, looks := false, 0
		f.mu.Lock()
		f.looking = func(s *fileSource, fingerprinted bool) {
			// The second look: the one the move itself takes, after the
			// look and the listing that found nothing before the file.
			if fingerprinted && !done {
				if looks++; looks < 2 {
					return
				}
				done = true
				ff.rotateCopies()
				ff.copyTruncate(".1")
				ff.write("c1-longer\n")
			}
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 4))
		if !done {
			t.Fatal("the feed never looked at the next file: the test did not copy while it looked")
		}
		b2 := nextFileEpoch(ff.identity(), b)
		ffCheckRecords(t, got, ffEpochRec(b), ffItem(b, 3, "b1"), ffEpochRec(b2), ffItem(b2, 10, "c1-longer"))
		ffNoMore(t, f)
	})
	t.Run("CopiedWhileThePathWasMissing", func(t *testing.T) {
		t.Parallel()
		// The feed finds the path missing after a rotation; before it lists
		// the generations, the writer makes the next file, writes b1 and
		// copies it (copytruncate, not yet truncated). The copy is the next
		// file's own lines, read there: read as a generation of its own as
		// well, b1 would come twice.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		wrote := false
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			if !wrote {
				wrote = true
				ff.write("b1\n")
				ff.rotateCopies()
				ff.write("b1\n", ff.path+".1")
			}
			return listGenerationsOnce(path)
		}
		f.mu.Unlock()
		ff.rename(".1") // the next look finds the path missing, then lists
		got := ffDescribeAll(ffCollect(t, f, 2))
		if !wrote {
			t.Fatal("the feed never listed the generations: the test did not write while it looked")
		}
		b := ff.epoch()
		ffCheckRecords(t, got, ffEpochRec(b), ffItem(b, 3, "b1"))
		ff.truncate(0)
		ff.write("c1\n")
		c := nextFileEpoch(ff.identity(), b)
		ffExpect(t, f, ffEpochRec(c), ffItem(c, 3, "c1"))
	})
	for _, copied := range []bool{false, true} {
		t.Run(fmt.Sprintf("TruncatedAfterTheLookBeforeTheMoveCopied%v", copied), func(t *testing.T) {
			t.Parallel()
			// The feed read the rotated file to its end and found the next
			// one; between that look and its move, the rotated file is
			// truncated and written again with fewer bytes than were read
			// (copied first, with a2 written after the look, when copied).
			// What it held is read from the copy, and what it holds now
			// under its next epoch, before the move: not passed over as a
			// file that did not grow.
			ff := ffNewFile(t)
			ff.write("a1\n")
			f := ff.open(outbox.Checkpoint{})
			a := ff.epoch()
			ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
			old := ff.rename(".1")
			ff.write("b1\n")
			b := ff.epoch()
			wrote := false
			f.mu.Lock()
			f.listOnce = func(path string) ([]generation, error) {
				if !wrote {
					wrote = true
					if copied {
						ff.write("a2\n", old)
						ff.write("a1\na2\n", ff.path+".2")
					}
					if err := os.Truncate(old, 0); err != nil {
						t.Error(err)
					}
					ff.write("x\n", old)
					// Written again later than the copy was made.
					later := time.Now().Add(time.Second)
					if err := os.Chtimes(old, later, later); err != nil {
						t.Error(err)
					}
				}
				return listGenerationsOnce(path)
			}
			f.mu.Unlock()
			var want []string
			if copied {
				want = append(want, ffItem(a, 6, "a2"))
			}
			n := len(want) + 4
			if !copied {
				n++ // the loss below
			}
			got := ffDescribeAll(ffCollect(t, f, n))
			if !wrote {
				t.Fatal("the feed never listed the generations: the test did not truncate while it looked")
			}
			a2 := nextFileEpoch(ff.identityOf(old), a)
			if !copied {
				// Renamed away, the file is no longer watched under its
				// name: nothing rules out writes before the truncation.
				want = append(want, ffLoss(a, 3, ingest.UnknownPosition, LossUnseenTruncated))
			}
			want = append(want, ffEpochRec(a2), ffItem(a2, 2, "x"), ffEpochRec(b), ffItem(b, 3, "b1"))
			ffCheckRecords(t, got, want...)
			ffNoMore(t, f)
		})
	}
	t.Run("NextFileOpenedEmptyCopiedAndTruncatedAfterTheListing", func(t *testing.T) {
		t.Parallel()
		// The feed opened the next file while it was still empty. It then
		// lists the generations (nothing to read before the file) and,
		// before it looks at the file again, the file is written, copied,
		// truncated and written again: what it held is in the copy only.
		// The copy is read, then what the file holds now.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rename(".1")
		ff.write("")
		ffNoMore(t, f)
		f.mu.Lock()
		opened := f.next != nil && f.next.id.fp == ""
		f.mu.Unlock()
		if !opened {
			t.Fatal("the feed did not open the empty next file: the test did not play its race")
		}
		cpy := ff.path + ".1"
		calls := 0
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			gens, err := listGenerationsOnce(path)
			if calls++; calls == 2 { // the listing that settles: nothing before the file
				ff.write("b1\n")
				ff.rotateCopies()
				ff.write("b1\n", cpy)
				ff.truncate(0)
				ff.write("c1\n")
			}
			return gens, err
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 4))
		if calls < 2 {
			t.Fatal("the feed never listed the generations: the test did not copy after the listing")
		}
		eCopy, c := ff.epochOf(cpy), ff.epoch()
		ffCheckRecords(t, got, ffEpochRec(eCopy), ffItem(eCopy, 3, "b1"), ffEpochRec(c), ffItem(c, 3, "c1"))
		ffNoMore(t, f)
	})
	t.Run("NextFileCopiedAndTruncatedThriceBeforeTheMove", func(t *testing.T) {
		t.Parallel()
		// The feed opened the next file while it held b1, and is still
		// reading the file before it when copytruncate runs twice: b1's
		// and b2's copies are read as generations. As the feed moves to
		// the file (after its look and its listing found nothing more to
		// read first), copytruncate runs a third time: b3 is only in its
		// copy, made after that listing. The file's first life (b1) has
		// its copy read already; b3's copy must be read too, before b4,
		// not passed over with no loss.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rename(".1")
		ff.write("b1\n")
		next := ff.identityOf(ff.path)
		var copies []fileID
		copyTruncate := func(then string) {
			ff.rotateCopies()
			copies = append(copies, ff.identityOf(ff.copyTruncate(".1")))
			ff.write(then)
		}
		listed := false
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			if !listed { // the feed has the next file open, holding b1
				listed = true
				copyTruncate("b2\n")
				copyTruncate("b3\n")
			}
			return listGenerationsOnce(path)
		}
		looks := 0
		f.looking = func(s *fileSource, fingerprinted bool) {
			if fingerprinted || !s.id.sameInode(next) || len(copies) != 2 || f.cur == nil || !f.cur.id.sameInode(copies[1]) {
				return
			}
			if looks++; looks == 2 { // the move's own look, after the look and the listing before it
				copyTruncate("b4\n")
			}
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 8))
		if looks < 2 || len(copies) != 3 {
			t.Fatalf("%d looks at the next file, %d copies: the test did not copy a third time as the feed moved", looks, len(copies))
		}
		e1, e2, e3, e4 := copies[0].String(), copies[1].String(), copies[2].String(), ff.epoch()
		want := []string{
			ffEpochRec(e1), ffItem(e1, 3, "b1"), ffEpochRec(e2), ffItem(e2, 3, "b2"),
			ffEpochRec(e3), ffItem(e3, 3, "b3"), ffEpochRec(e4), ffItem(e4, 3, "b4"),
		}
		ffCheckRecords(t, got, want...)
		ffNoMore(t, f)
	})
	t.Run("EmptyFileWrittenAndRotatedWhileItIsLookedAt", func(t *testing.T) {
		t.Parallel()
		// A new feed on an empty file. Just after the feed finds it still
		// without a first line, the writer puts b1 into it and rotates it
		// away for c1. The feed finds c1's file, and must read b1 first:
		// not pass the file over as one whose line never completed.
		ff := ffNewFile(t)
		ff.write("")
		f := New(ff.path, Options{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
		t.Cleanup(func() { f.Close() })
		rotated := false
		f.looking = func(s *fileSource, fingerprinted bool) {
			if !fingerprinted || rotated || s != f.cur {
				return
			}
			rotated = true
			ff.write("b1\n")
			ff.rotate()
			ff.write("c1\n")
		}
		if err := f.Open(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		got := ffDescribeAll(ffCollect(t, f, 4))
		if !rotated {
			t.Fatal("the feed never looked at the empty file: the test did not rotate while it looked")
		}
		b, c := ff.epochOf(ff.path+".1"), ff.epoch()
		ffCheckRecords(t, got, ffEpochRec(b), ffItem(b, 3, "b1"), ffEpochRec(c), ffItem(c, 3, "c1"))
		ffNoMore(t, f)
	})
	t.Run("NextFileEmptiedThenCopiedAndTruncatedAgain", func(t *testing.T) {
		t.Parallel()
		// The next file, opened holding b1, is copied and truncated; b1 is
		// read from the copy, and the feed comes to the file while it is
		// empty. Before the feed's next look, the file gets b2, is copied
		// and truncated again, and gets b3: b2 is only in its copy, read
		// before b3, not passed over.
		ff := ffNewFile(t)
		f, _ := ffNextFileOpenedWithB1(t, ff)
		ff.rotateCopies()
		e1 := ff.epochOf(ff.copyTruncate(".1"))
		ffExpect(t, f, ffEpochRec(e1), ffItem(e1, 3, "b1")) // and the feed comes to the empty file
		ff.write("b2\n")
		ff.rotateCopies()
		e2 := ff.epochOf(ff.copyTruncate(".1"))
		ff.write("b3\n")
		b := ff.epoch()
		ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 3, "b2"), ffEpochRec(b), ffItem(b, 3, "b3"))
	})
	t.Run("NextFileTruncatedUncopiedThenCopiedAsTheFeedMoves", func(t *testing.T) {
		t.Parallel()
		// The next file, opened holding b1, is truncated with no copy made
		// and gets b2; as the feed moves to it, a copy of b2 is being made
		// (copytruncate, not yet truncated). b1 is lost, once; b2 is read
		// in the file.
		ff := ffNewFile(t)
		f, _ := ffNextFileOpenedWithB1(t, ff)
		first := ff.epoch()
		ff.truncate(0)
		ff.write("b2\n")
		looks, copied := 0, false
		f.mu.Lock()
		f.looking = func(s *fileSource, fingerprinted bool) {
			if fingerprinted && !copied && s == f.next {
				if looks++; looks == 2 { // the move's own look
					copied = true
					ff.rotateCopies()
					ff.write("b2\n", ff.path+".1")
				}
			}
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 3))
		if !copied {
			t.Fatal("the feed did not look at the next file twice: the test did not copy as it moved")
		}
		b := ff.epoch()
		ffCheckRecords(t, got, ffLoss(first, 0, ingest.UnknownPosition, LossTruncated), ffEpochRec(b), ffItem(b, 3, "b2"))
		ffNoMore(t, f)
	})
	t.Run("GenerationRenamedWhileItIsOpened", func(t *testing.T) {
		t.Parallel()
		// Two rotations: b1's file is the generation after the current one.
		// On every try, rotations rename it between the listing that
		// settles and its opening. That it could not be opened says
		// nothing: the feed looks again once the renames stop and reads
		// b1 before c1, not the file at the path as if none came between.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.rotate()
		ff.write("b1\n")
		b := ff.epoch()
		ff.rotate()
		ff.write("c1\n")
		c := ff.epoch()
		now := time.Now()
		ff.touch(now.Add(-2*time.Second), ff.path+".2")
		ff.touch(now.Add(-time.Second), ff.path+".1")
		names := [2]string{ff.path + ".1", ff.path + ".3"}
		calls := 0
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			gens, err := listGenerationsOnce(path)
			// Each second listing agrees with the one before and is then
			// made stale: b1's file moves to the other name.
			if calls++; calls <= 4*listTries && calls%2 == 0 {
				if err := os.Rename(names[(calls/2+1)%2], names[(calls/2)%2]); err != nil {
					t.Error(err)
				}
			}
			return gens, err
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 4))
		if calls <= 2*listTries {
			t.Fatalf("%d listings: the test did not rename the generation on every try", calls)
		}
		ffCheckRecords(t, got, ffEpochRec(b), ffItem(b, 3, "b1"), ffEpochRec(c), ffItem(c, 3, "c1"))
		ffNoMore(t, f)
	})
	t.Run("CopyRenamedWhileItIsLookedFor", func(t *testing.T) {
		t.Parallel()
		// The file is copied and truncated; while the feed looks for the
		// copy, rotations rename it between each listing and its opening,
		// try after try. That no copy was found then says nothing: the
		// feed looks again once the renames stop, and reads a2 from it.
		ff := ffNewFile(t)
		ff.write("a1\n")
		f := ff.open(outbox.Checkpoint{})
		a := ff.epoch()
		ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
		ff.write("a2\n")
		ff.copyTruncate(".1")
		ff.write("b1\n")
		names := [2]string{ff.path + ".1", ff.path + ".2"}
		calls := 0
		f.mu.Lock()
		f.listOnce = func(path string) ([]generation, error) {
			gens, err := listGenerationsOnce(path)
			// Each second listing agrees with the one before and is then
			// made stale: the copy moves to the other name.
			if calls++; calls <= 4*listTries && calls%2 == 0 {
				from := names[(calls/2+1)%2]
				if err := os.Rename(from, names[(calls/2)%2]); err != nil {
					t.Error(err)
				}
			}
			return gens, err
		}
		f.mu.Unlock()
		got := ffDescribeAll(ffCollect(t, f, 3))
		if calls <= 2*listTries {
			t.Fatalf("%d listings: the test did not rename the copy on every try", calls)
		}
		b := nextFileEpoch(ff.identity(), a)
		ffCheckRecords(t, got, ffItem(a, 6, "a2"), ffEpochRec(b), ffItem(b, 3, "b1"))
		ffNoMore(t, f)
	})
}
