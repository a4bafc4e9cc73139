package filefeed

import (
	"fmt"
	"time"

	"github.com/outboxd/outboxd/ingest"
)

// Bounds of the wait for the watcher's events at a truncation (see
// settle): the events the kernel queued before the look reach the
// feed within settleMax, and once as many as the truncation accounts for
// have come, settleQuiet without another says the queue is drained.
const (
	settleQuiet = 50 * time.Millisecond
	settleMax   = 2 * time.Second
	settleTick  = 5 * time.Millisecond
)

// writes is what the evidence says of writes to a file between the
// feed's last look at it and its truncation.
type writes int

const (
	writesUnknown writes = iota // nothing rules them out
	writesNone                  // ruled out
	writesSome                  // there were some
)

// writesSince weighs the evidence of writes to c, the current file, between
// the feed's look at which Feed.mods was since and its truncation. Each
// write, and the truncation, is one event of each watch of the file: a
// truncation costs one modification, and a file that holds bytes again was
// written at least once since. Exactly that many events rule unread writes
// out; more, with the file empty, prove some; anything else (more events
// and bytes that more writes may explain, fewer events than the file's own
// changes, the file watched less than twice, or no longer under the name
// it is watched by) rules nothing out. The events and the size are taken
// once both have settled (see settle).
func (f *Feed) writesSince(c *fileSource, since int64) writes {
	if c.watches < 2 || !f.stillNamed(c) {
		return writesUnknown
	}
	n, size, err := f.settle(c, since)
	if err != nil {
		f.log.Warn("cannot weigh the file's write events", logErr, err)
		return writesUnknown
	}
	want := expectedMods(c.watches, size)
	switch {
	case n >= overflowMods:
		return writesUnknown // the kernel dropped events: they count nothing
	case n == want:
		return writesNone
	case n > want && size == 0:
		return writesSome
	}
	return writesUnknown
}

// expectedMods is how many write events a truncation and the writes since
// cost at least, for a file with watches watches that holds size bytes.
func expectedMods(watches int, size int64) int64 {
	if size > 0 {
		return 2 * int64(watches)
	}
	return int64(watches)
}

// stillNamed reports whether c is still the file at the name it is
// watched by: its directory's events name it so.
func (f *Feed) stillNamed(c *fileSource) bool {
	fi, err := statPath(c.file.Name())
	return err == nil && fi != nil && fileIDOf(fi).sameInode(c.id)
}

// settle returns Feed.mods less since, and c's size, once the watcher has
// taken at least as many events since as the truncation and the size
// account for (see expectedMods) and then neither has changed for
// settleQuiet; or as they are after settleMax. The kernel queues a file's
// events in order: once the truncation's own have come, so have those of
// every write before it; the quiet lets a queue that a stopped process
// left full drain to its end, and writes that come meanwhile be counted
// with the bytes they add.
func (f *Feed) settle(c *fileSource, since int64) (int64, int64, error) {
	if f.settling != nil {
		f.settling()
	}
	start := time.Now()
	stable := start
	last, size := f.mods.Load(), int64(-1)
	t := time.NewTicker(settleTick)
	defer t.Stop()
	for {
		fi, err := c.file.Stat()
		if err != nil {
			return 0, 0, fmt.Errorf("stat %s: %w", c.file.Name(), err)
		}
		now := time.Now()
		if n := f.mods.Load(); n != last || fi.Size() != size {
			last, size, stable = n, fi.Size(), now
		}
		n := last - since
		if n >= expectedMods(c.watches, size) && now.Sub(stable) >= settleQuiet || now.Sub(start) >= settleMax {
			return n, size, nil
		}
		<-t.C
	}
}

// loseUnseen records what the truncation of the current file c (its old
// epoch read to pos, every byte seen of it read, no copy found) lost, as
// the evidence of writes since the look at which Feed.mods was since tells
// (see writesSince).
func (f *Feed) loseUnseen(c *fileSource, old string, pos, since int64) {
	if f.opts.AssumeNoUnseenWrites {
		f.log.Warn("file truncated after every byte seen had been read, and no copy found: "+
			"nothing is recorded lost, as no bytes are assumed written while the feed was not looking",
			logEpoch, old, logFrom, pos)
		return
	}
	switch f.writesSince(c, since) {
	case writesNone:
		f.log.Info("file truncated after every byte written to it had been read: nothing lost",
			logEpoch, old, logFrom, pos)
	case writesSome:
		f.lose(old, pos, ingest.UnknownPosition, LossTruncated)
	default:
		f.lose(old, pos, ingest.UnknownPosition, LossUnseenTruncated)
	}
}
