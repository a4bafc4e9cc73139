package filefeed

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// resume positions the feed after cp, the stored checkpoint of partition 0:
// in the checkpoint's file, found again by its inode at the path or among
// the generations beside it, or, when it is gone, before the generations
// that followed it.
func (f *Feed) resume(cp outbox.Checkpoint) error {
	f.prev = cp.Epoch
	at, _ := f.openPathFile() // missing or unreadable: waited for once nothing else is left

	stored, ok := parseFileEpoch(cp.Epoch)
	if !ok { // not an epoch of this feed kind: nothing to look for
		return f.resumeGone(at, cp, stored, nil)
	}
	home, err := f.findStored(stored, at)
	if err != nil {
		return errors.Join(err, f.closeSource(at))
	}
	if home == nil {
		var m *chainMark
		if cp.UpdatedAt != 0 {
			m = &chainMark{since: time.Unix(0, cp.UpdatedAt), strict: true}
		}
		return f.resumeGone(at, cp, stored, m)
	}
	return f.resumeIn(home, at, stored, cp)
}

// feedState is what resume may change in a Feed: saved before it, and put
// back when it fails (see Feed.resumeOnce).
type feedState struct {
	prev      string
	cur, next *fileSource
	held      []*fileSource
	pending   []ingest.Record
	floor     *chainMark
	lostGens  map[fileID]bool
	passed    map[fileID]bool
}

func (f *Feed) saveState() feedState {
	return feedState{
		prev: f.prev, cur: f.cur, next: f.next, held: slices.Clone(f.held),
		pending: slices.Clone(f.pending), floor: f.floor,
		lostGens: maps.Clone(f.lostGens), passed: maps.Clone(f.passed),
	}
}

// restoreState puts st back, closing the files the feed took since st was
// saved. Those a failed step closed already are passed over.
func (f *Feed) restoreState(st feedState) error {
	kept := map[*fileSource]bool{st.cur: true, st.next: true}
	for _, h := range st.held {
		kept[h] = true
	}
	var errs []error
	for _, s := range append([]*fileSource{f.cur, f.next}, f.held...) {
		if s == nil || kept[s] {
			continue
		}
		kept[s] = true // listed once, closed once
		if err := s.close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	f.prev, f.cur, f.next, f.held = st.prev, st.cur, st.next, st.held
	f.pending, f.floor, f.lostGens, f.passed = st.pending, st.floor, st.lostGens, st.passed
	return errors.Join(errs...)
}

// findStored returns the file on the checkpoint's inode, whatever it holds
// now: the file at the path (at), or a generation. It returns nil when there
// is none.
func (f *Feed) findStored(stored fileEpoch, at *fileSource) (*fileSource, error) {
	if at != nil && at.id.sameInode(stored.id) {
		return at, nil
	}
	for range listTries {
		gens, err := f.generations()
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(gens, func(g generation) bool { return !g.compressed && g.id.sameInode(stored.id) })
		if i < 0 {
			return nil, nil
		}
		s, err := openGeneration(gens[i], f.opts.MaxLine)
		if err != nil || s != nil {
			return s, err
		}
		// renamed by a rotation since the listing: list again
	}
	// Renamed again on every try: that it was not opened says nothing
	// (taken for gone, its rest would be reported lost, or read again).
	return nil, fmt.Errorf("open the checkpoint's file among the generations of %s: %w", f.path, errUnsettled)
}

// resumeIn resumes in home, the file on the checkpoint's inode: after the
// position when it is intact (the checkpoint's fingerprint, at least the
// position long, a line ending at the position, and no later copy it
// disowns: see copyDisowned). Otherwise home is either a new file that took
// the inode of the checkpoint's file, deleted while the feed was stopped (see
// reusedInode), or the checkpoint's file started over in place: the rest of
// the checkpoint's epoch is then read from its copy first, or reported lost
// with an unknown extent, and home is read from 0 under a new epoch. at, the
// file at the path, follows home when it is another file.
func (f *Feed) resumeIn(home, at *fileSource, stored fileEpoch, cp outbox.Checkpoint) error {
	intact, err := f.intact(home, stored.id.fp, cp.Position)
	if err != nil {
		return errors.Join(err, f.closeSource(home), f.closeSource(at))
	}
	if home != at {
		f.next = at
	}
	// Only at the path: beside a rotated file, later generations with the
	// same first line are no copies of it.
	if intact && home == at && cp.UpdatedAt != 0 {
		cpy, err := f.copyDisowned(home, stored, cp)
		if err != nil {
			return errors.Join(err, f.closeSource(home))
		}
		if cpy != nil {
			f.log.Info("file truncated and written again while stopped; its copy holds the rest", logFile, cpy.file.Name(), logEpoch, cp.Epoch)
			return f.restartAfterCopy(home, at, cpy, cp)
		}
	}
	if intact {
		if home != at {
			f.log.Info("resuming in a rotated generation", logFile, home.file.Name(), logEpoch, cp.Epoch)
		}
		home.epoch = cp.Epoch
		f.use(home)
		return home.seek(cp.Position)
	}
	reused, err := f.reusedInode(home, at, cp)
	if err != nil || reused {
		if reused {
			f.log.Info("a new file took the inode of the checkpoint's file", logFile, home.file.Name(), logEpoch, cp.Epoch)
			if home != at {
				f.held = append(f.held, home)
			}
			return f.resumeGone(at, cp, stored, &chainMark{since: time.Unix(0, cp.UpdatedAt), strict: true})
		}
		return errors.Join(err, f.closeSource(home))
	}
	want := copyWant{of: stored.id, pos: cp.Position, size: cp.End, tail: lineEnd(cp.Position),
		since: time.Unix(0, cp.UpdatedAt), lone: true}
	cpy, err := f.findCopy(want)
	if err != nil {
		return errors.Join(err, f.closeSource(home))
	}
	f.log.Info("file started over in place while stopped", logFile, home.file.Name(), logEpoch, cp.Epoch, logFrom, cp.Position)
	if cpy != nil {
		return f.restartAfterCopy(home, at, cpy, cp)
	}
	switch {
	case cp.End > cp.Position:
		f.lose(cp.Epoch, cp.Position, ingest.UnknownPosition, LossTruncated)
	case f.opts.AssumeNoUnseenWrites:
		f.log.Warn("file truncated while stopped after every byte seen had been read, and no copy found: "+
			"nothing is recorded lost, as no bytes are assumed written while the feed was not looking",
			logEpoch, cp.Epoch, logFrom, cp.Position)
	default:
		f.lose(cp.Epoch, cp.Position, ingest.UnknownPosition, LossUnseenTruncated)
	}
	f.use(home)
	return nil
}

// restartAfterCopy reads the rest of the checkpoint's epoch from cpy, then
// home, the checkpoint's file started over in place, from 0.
func (f *Feed) restartAfterCopy(home, at, cpy *fileSource, cp outbox.Checkpoint) error {
	home.restartOf = cp.Epoch
	if err := home.seek(0); err != nil {
		return errors.Join(err, cpy.close(), home.close())
	}
	if home != at {
		f.held = append(f.held, home) // a generation now: read in its turn, after the copy
		return f.readCopy(cpy, nil, cp.Epoch, cp.Position)
	}
	if err := f.readCopy(cpy, home, cp.Epoch, cp.Position); err != nil {
		return errors.Join(err, home.close())
	}
	return nil
}

// reusedInode reports whether home, on the checkpoint's inode but not
// holding the checkpoint's file, is a new file that took that inode after
// the file was deleted: it was born after the checkpoint was stored, or (at
// the path, where the file system keeps no birth times) generations were
// modified since, so the file was rotated away rather than truncated.
func (f *Feed) reusedInode(home, at *fileSource, cp outbox.Checkpoint) (bool, error) {
	if cp.UpdatedAt == 0 {
		return false, nil
	}
	since := time.Unix(0, cp.UpdatedAt)
	born, ok := birthTime(home.file)
	switch {
	case ok:
		return born.After(since), nil
	case home != at:
		return false, nil
	}
	return f.rotatedSince(since, home)
}

// copyDisowned returns the copy of the checkpoint's file made since the
// checkpoint (see findCopy) when s, the file on the checkpoint's inode that
// looks intact, does not hold the copy's bytes: a file only grows until it
// is truncated, so a copy that s is shorter than, or differs from, shows
// that s was truncated and written again past the position (with the same
// first line and a line ending at the position). Otherwise it returns nil:
// s is the file the checkpoint read.
func (f *Feed) copyDisowned(s *fileSource, stored fileEpoch, cp outbox.Checkpoint) (*fileSource, error) {
	want := copyWant{of: stored.id, pos: cp.Position, size: cp.End, tail: lineEnd(cp.Position),
		since: time.Unix(0, cp.UpdatedAt), madeSince: true}
	cpy, err := f.findCopy(want)
	if err != nil || cpy == nil {
		return nil, err
	}
	same, err := sameBytes(cpy, s, max(cp.Position-compareBefore, 0), cpy.size)
	if err != nil || same {
		return nil, errors.Join(err, cpy.close())
	}
	return cpy, nil
}

// compareBefore and compareMax bound the bytes sameBytes compares: from a
// little before the position, at most a MiB.
const (
	compareBefore = 64 << 10
	compareMax    = 1 << 20
)

// sameBytes reports whether b holds a's bytes from..to (at most compareMax
// of them).
func sameBytes(a, b *fileSource, from, to int64) (bool, error) {
	to = min(to, from+compareMax)
	if b.size < to {
		return false, nil
	}
	bufA, bufB := make([]byte, 32<<10), make([]byte, 32<<10)
	for off := from; off < to; {
		n := int(min(int64(len(bufA)), to-off))
		if _, err := a.file.ReadAt(bufA[:n], off); err != nil {
			return false, fmt.Errorf("read %s at %d: %w", a.file.Name(), off, err)
		}
		if _, err := b.file.ReadAt(bufB[:n], off); err != nil {
			return false, fmt.Errorf("read %s at %d: %w", b.file.Name(), off, err)
		}
		if !bytes.Equal(bufA[:n], bufB[:n]) {
			return false, nil
		}
		off += int64(n)
	}
	return true, nil
}

// rotatedSince reports whether a generation of the path (other than the
// file s) was modified after since: the checkpoint's file, whose inode s
// now has, was rotated away, not truncated, and s is a new file.
func (f *Feed) rotatedSince(since time.Time, s *fileSource) (bool, error) {
	gens, err := f.generations()
	if err != nil {
		return false, err
	}
	for _, g := range gens {
		if g.mtime.After(since) && !g.id.sameInode(s.id) {
			return true, nil
		}
	}
	return false, nil
}

// intact reports whether s still holds what the checkpoint at pos read in
// it: its fingerprint is fp, it is at least pos long, and a line ends at pos.
func (f *Feed) intact(s *fileSource, fp string, pos int64) (bool, error) {
	if s.id.fp != fp || s.size < pos {
		return false, nil
	}
	return s.holds(lineEnd(pos), pos)
}

// lineEnd is what a file holds just before a position after a line.
func lineEnd(pos int64) []byte {
	if pos == 0 {
		return nil
	}
	return []byte{'\n'}
}

// resumeGone handles a checkpoint whose file is nowhere: deleted, replaced,
// or compressed. The bytes the checkpoint saw past its position are lost
// (none seen: nothing is known lost, a warning says so); where the file's
// compressed copy follows m, that is the loss, of unknown extent. Reading
// starts at the first generation after m (nil: none), then at, the file at
// the path.
func (f *Feed) resumeGone(at *fileSource, cp outbox.Checkpoint, stored fileEpoch, m *chainMark) error {
	compressed, err := f.compressedStored(stored, cp, m)
	if err != nil {
		return errors.Join(err, f.closeSource(at))
	}
	switch {
	case compressed:
	case !f.opts.AssumeNoUnseenWrites:
		f.lose(cp.Epoch, cp.Position, ingest.UnknownPosition, LossVanished)
	case cp.End > cp.Position:
		f.lose(cp.Epoch, cp.Position, cp.End, LossReplaced)
	default:
		f.log.Warn("the checkpoint's file is gone, but every byte the checkpoint saw of it had been read: "+
			"nothing is recorded lost, as no bytes are assumed written while the feed was not looking",
			logEpoch, cp.Epoch, logFrom, cp.Position)
	}
	f.floor = m
	f.next = at
	return nil
}

// compressedStored reports the checkpoint's file lost when the generation
// that follows m is its compressed copy (its fingerprint), and says whether
// it did.
func (f *Feed) compressedStored(stored fileEpoch, cp outbox.Checkpoint, m *chainMark) (bool, error) {
	if m == nil {
		return false, nil
	}
	gens, err := f.generations()
	if err != nil {
		return false, err
	}
	after := m.after(gens)
	if len(after) == 0 || !after[0].compressed || contentFingerprint(after[0].name) != stored.id.fp {
		return false, nil
	}
	f.loseCompressed(after[0], cp.Epoch, cp.Position)
	return true, nil
}
