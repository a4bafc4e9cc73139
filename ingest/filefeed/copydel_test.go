package filefeed

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// ffNextFileOpenedWithB1 plays the start of the next file's copytruncate
// lifecycles: the feed reads a1 and a2 from the file a (renamed to .1),
// and has the file at the path, holding b1, open as the next one while it
// is still on a. It returns the feed and the next file's identity as it
// was opened (its first life).
func ffNextFileOpenedWithB1(t *testing.T, ff *ffFile) (*Feed, fileID) {
	t.Helper()
	ff.write("a1\n")
	f := ff.open(outbox.Checkpoint{})
	a := ff.epoch()
	ffExpect(t, f, ffEpochRec(a), ffItem(a, 3, "a1"))
	old := ff.rename(".1")
	ff.write("b1\n")
	next := ff.identityOf(ff.path)
	wrote := false
	f.mu.Lock()
	f.listOnce = func(path string) ([]generation, error) {
		if !wrote { // the feed has the next file open: a2 keeps it on a
			wrote = true
			ff.write("a2\n", old)
		}
		return listGenerationsOnce(path)
	}
	f.mu.Unlock()
	if got := ffDescribeAll(ffCollect(t, f, 1)); got[0] != ffItem(a, 6, "a2") {
		t.Fatalf("got %v, want a2", got)
	}
	f.mu.Lock()
	f.listOnce = listGenerationsOnce
	opened := f.next != nil && f.next.id == next
	f.mu.Unlock()
	if !opened {
		t.Fatal("the feed did not open the next file while it held b1: the test did not play its race")
	}
	return f, next
}

// TestFeed_FirstLifeCopyGone: the next file is copied (copytruncate) and
// truncated before the feed gets to it; the feed reads that first life
// from the copy, as a generation of its own. What becomes of the copy
// afterwards (deleted, compressed, renamed out of the rotation scheme's
// names, before the move or while the feed moves) takes nothing unread
// away: no loss. A copy that goes before it was read is a loss.
func TestFeed_FirstLifeCopyGone(t *testing.T) {
	gone := []struct {
		name string
		do   func(ff *ffFile, cpy string)
	}{
		{"Deleted", func(ff *ffFile, cpy string) {
			if err := os.Remove(cpy); err != nil {
				ff.t.Fatal(err)
			}
		}},
		{"Compressed", func(ff *ffFile, cpy string) { ff.gzip(cpy) }},
		{"RenamedAway", func(ff *ffFile, cpy string) {
			if err := os.Rename(cpy, ff.path+".old"); err != nil {
				ff.t.Fatal(err)
			}
		}},
	}
	for _, g := range gone {
		for _, regrown := range []bool{true, false} {
			name := g.name + map[bool]string{true: "Regrown", false: "LeftEmpty"}[regrown]
			t.Run(name+"BeforeTheMove", func(t *testing.T) {
				t.Parallel()
				ff := ffNewFile(t)
				f, _ := ffNextFileOpenedWithB1(t, ff)
				ff.rotateCopies()
				cpy := ff.copyTruncate(".1")
				if regrown {
					ff.write("c1\n")
				}
				eCopy := ff.epochOf(cpy)
				ffCheckCollected(t, ffCollect(t, f, 2), ffEpochRec(eCopy), ffItem(eCopy, 3, "b1"))
				g.do(ff, cpy) // read to its end, and the feed has not moved on yet
				if !regrown {
					ffNoMore(t, f)
					ff.write("c1\n")
				}
				c := ff.epoch()
				ffExpect(t, f, ffEpochRec(c), ffItem(c, 3, "c1"))
			})
		}
		t.Run(g.name+"WhileTheFeedMoves", func(t *testing.T) {
			t.Parallel()
			ff := ffNewFile(t)
			f, next := ffNextFileOpenedWithB1(t, ff)
			ff.rotateCopies()
			cpy := ff.copyTruncate(".1")
			ff.write("c1\n")
			eCopy, copyID := ff.epochOf(cpy), ff.identityOf(cpy)
			ffCheckCollected(t, ffCollect(t, f, 2), ffEpochRec(eCopy), ffItem(eCopy, 3, "b1"))
			done := false
			f.mu.Lock()
			f.looking = func(s *fileSource, fingerprinted bool) {
				// The look at the next file that shows it started over,
				// with the copy read to its end as the current file.
				if done || !fingerprinted || !s.id.sameInode(next) || f.cur == nil || !f.cur.id.sameInode(copyID) {
					return
				}
				done = true
				g.do(ff, cpy)
			}
			f.mu.Unlock()
			c := ff.epoch()
			ffExpect(t, f, ffEpochRec(c), ffItem(c, 3, "c1"))
			if !done {
				t.Fatal("the feed never looked at the next file after the copy: the test did not remove the copy as it moved")
			}
		})
	}
	t.Run("DeletedWhileItIsRead", func(t *testing.T) {
		t.Parallel()
		// The copy is deleted after its first line is read: the feed has
		// it open and reads it to its end, with nothing lost.
		ff := ffNewFile(t)
		f, _ := ffNextFileOpenedWithB1(t, ff)
		ff.write("b2\n")
		ff.rotateCopies()
		cpy := ff.copyTruncate(".1")
		ff.write("c1\n")
		eCopy := ff.epochOf(cpy)
		ffCheckCollected(t, ffCollect(t, f, 2), ffEpochRec(eCopy), ffItem(eCopy, 3, "b1"))
		if err := os.Remove(cpy); err != nil {
			t.Fatal(err)
		}
		c := ff.epoch()
		ffExpect(t, f, ffItem(eCopy, 6, "b2"), ffEpochRec(c), ffItem(c, 3, "c1"))
	})
	t.Run("DeletedBeforeItWasRead", func(t *testing.T) {
		t.Parallel()
		// The copy goes before the feed listed it: b1 is gone unread.
		ff := ffNewFile(t)
		f, next := ffNextFileOpenedWithB1(t, ff)
		ff.rotateCopies()
		cpy := ff.copyTruncate(".1")
		ff.write("c1\n")
		if err := os.Remove(cpy); err != nil {
			t.Fatal(err)
		}
		c := ff.epoch()
		ffExpect(t, f, ffLoss(next.String(), 0, ingest.UnknownPosition, LossTruncated), ffEpochRec(c), ffItem(c, 3, "c1"))
	})
	t.Run("CompressedBeforeItWasRead", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		f, next := ffNextFileOpenedWithB1(t, ff)
		ff.rotateCopies()
		cpy := ff.copyTruncate(".1")
		ff.write("c1\n")
		gz := ff.gzip(cpy)
		c := ff.epoch()
		ffExpect(t, f, ffLoss(ff.gzEpochOf(gz), 0, ingest.UnknownPosition, LossCompressed),
			ffLoss(next.String(), 0, ingest.UnknownPosition, LossTruncated), ffEpochRec(c), ffItem(c, 3, "c1"))
	})
}

// ffCheckCollected checks records against want, as ffExpect does, without
// waiting for more.
func ffCheckCollected(t *testing.T, recs []ingest.Record, want ...string) {
	t.Helper()
	ffCheckRecords(t, ffDescribeAll(recs), want...)
}

// ffCheckRecords fails the test unless got (records as ffDescribeAll
// describes them) is want.
func ffCheckRecords(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("records:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}
