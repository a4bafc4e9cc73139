package filefeed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/ingest"
)

// advance moves the feed on when the current file has no complete line
// ready: it opens the first file once one exists, announces a file's epoch
// once it has a fingerprint, and, before reading on past an end found
// earlier, looks for growth, truncation and rotation. It reports whether
// anything changed, so that reading may go on.
func (f *Feed) advance() (bool, error) {
	switch {
	case f.cur == nil:
		return f.begin()
	case f.cur.epoch == "":
		return f.announceCurrent()
	}
	c := f.cur
	before, lookedBefore, modsBefore := c.mtime, c.lookedAt, c.mods
	c.lookedAt = f.clock()
	c.mods = f.mods.Load() // before the stat: the events of what it shows are counted by now or after
	size, err := c.stat()
	if err != nil {
		return false, err
	}
	truncated, err := f.truncated(size)
	switch {
	case err != nil:
		return false, err
	case truncated:
		err := f.restart(size, before, modsBefore)
		if errors.Is(err, errUnsettled) {
			// Looked at again once the rotation is done, as if not yet:
			// the copy is chosen by what was seen before the truncation.
			c.mtime, c.lookedAt, c.mods = before, lookedBefore, modsBefore
			return false, nil
		}
		return true, err
	}
	c.saw(size)
	if size > c.split.fed() {
		c.atEOF = false
		return true, nil
	}
	return f.rotate()
}

// begin finds the first file to read: after a checkpoint whose file is gone,
// the first generation modified since; otherwise (or when there is none) the
// file at the path, once it exists.
func (f *Feed) begin() (bool, error) {
	if f.floor != nil {
		g, err := f.nextGeneration(*f.floor)
		if errors.Is(err, errUnsettled) {
			return false, nil // a rotation is under way: look again once it is done
		}
		if err != nil || g != nil {
			if g != nil {
				f.floor = nil
				f.use(g)
			}
			return g != nil, err
		}
	}
	if f.next != nil {
		s := f.next
		f.next, f.floor = nil, nil
		f.use(s)
		return true, nil
	}
	s := f.openAtPath()
	if s == nil {
		return false, nil
	}
	f.floor = nil
	f.use(s)
	return true, nil
}

// announceCurrent announces the current file's epoch once the file has a
// fingerprint. Until then, a file that another follows (the path now holds
// another file, or a later generation is there) is passed over: its bytes,
// if any, were a line that never completed.
func (f *Feed) announceCurrent() (bool, error) {
	// The size is the one seen before the fingerprint was read (see look):
	// bytes written after it are looked at again before the file is passed
	// over (see grewBeforeRotation).
	fp, ok, err := f.look(f.cur)
	switch {
	case errors.Is(err, errUnsettled):
		return false, nil // started over while looked at: looked at again
	case err != nil:
		return false, err
	case ok:
		f.cur.id.fp = fp
		f.announce(f.cur)
		return true, nil
	}
	f.cur.saw(f.cur.size)
	return f.rotate()
}

// truncated reports whether the current file started over in place: it is
// shorter than what was read of it, its first line changed, or the bytes
// before the read position are no longer the last line read (truncated and
// written again past the position between two looks).
func (f *Feed) truncated(size int64) (bool, error) {
	c := f.cur
	if size < c.split.fed() {
		return true, nil
	}
	fp, ok, err := c.fingerprint()
	if err != nil || !ok || fp != c.id.fp {
		return err == nil, err
	}
	same, err := c.holds(c.lastLineTail(), c.split.pos)
	return !same, err
}

// restart reads the current file, which started over in place, from 0 under
// a new epoch (announced once it has a first line). The rest of its old
// epoch is read first from a copy, when there is one (copytruncate);
// otherwise it is a RecordLoss of unknown extent when bytes past the
// position had been seen, or when the file's write events since the last
// look (Feed.mods was since then) do not rule out unread bytes (see
// loseUnseen). before is the file's modification time as last seen before
// the truncation.
func (f *Feed) restart(size int64, before time.Time, since int64) error {
	c := f.cur
	want := copyWant{
		of: c.id, pos: c.split.pos, size: c.seen, tail: c.lastLineTail(), since: before,
	}
	cp, err := f.findCopy(want)
	if err != nil {
		return err
	}
	old := c.epoch
	f.log.Info("file truncated", logEpoch, old, logFrom, c.split.pos, "size", size)
	c.epoch, c.id.fp, c.seen, c.restartOf = "", "", size, old
	c.last = fileLine{}
	if err := c.seek(0); err != nil {
		return err
	}
	if cp != nil {
		return f.readCopy(cp, c, old, want.pos)
	}
	if want.size > want.pos {
		f.lose(old, want.pos, ingest.UnknownPosition, LossTruncated)
		return nil
	}
	f.loseUnseen(c, old, want.pos, since)
	return nil
}

// readCopy makes cp, the copy of the file whose epoch old was read to pos,
// the current file from pos, in that epoch. then, the file itself started
// over in place, follows it (nil: the next file stays as it is).
func (f *Feed) readCopy(cp, then *fileSource, old string, pos int64) error {
	f.log.Info("reading the rest of the truncated file from its copy", logFile, cp.file.Name(), logEpoch, old, logFrom, pos)
	cp.epoch, cp.copyOf = old, true
	if err := cp.seek(pos); err != nil {
		return errors.Join(err, cp.close())
	}
	f.cur = nil
	switch {
	case then == nil:
	case f.next != nil && f.next != then:
		// then was rotated away (another file is at the path): read as a
		// generation in its turn, after the copy, before the next file.
		f.held = append(f.held, then)
	default:
		f.next = then
	}
	f.use(cp)
	return nil
}

// rotate moves on from the current file, read to its end, when another file
// follows it: the next generation after it, else the file now at the path
// once that has a fingerprint (until then the writer may still be finishing
// the current file). What was seen past the current file's last complete
// line is reported lost. It reports whether it moved on. With nothing to
// move on to and no file at the path, the feed is waiting for it.
func (f *Feed) rotate() (bool, error) {
	next, here, why, err := f.upcoming()
	if err != nil || here {
		return false, err
	}
	g, err := f.nextGeneration(markOf(f.cur))
	if errors.Is(err, errUnsettled) {
		return false, nil // a rotation is under way: look again once it is done
	}
	if err != nil {
		return false, err
	}
	if g == nil {
		if next == nil {
			f.setWaiting(why)
			return false, nil
		}
		g, err = f.lookBeforeTheMove(next)
		if errors.Is(err, errUnsettled) {
			return false, nil
		}
		if err != nil || g == nil && next.id.fp == "" {
			return false, err // no first line yet: the writer may still be finishing the current file
		}
	}
	grown, err := f.grewBeforeRotation()
	switch {
	case (err != nil || grown) && g != nil:
		f.held = append(f.held, g) // its turn comes after the current file's end
		return grown, err
	case err != nil || grown:
		return grown, err
	case g == nil:
		g = next
	}
	if err := f.switchTo(g); err != nil {
		if errors.Is(err, errUnsettled) {
			return false, nil // g is held or next still: looked at again once the rotation is done
		}
		return false, err
	}
	return true, nil
}

// lookBeforeTheMove looks at next, the file at the path, once no
// generation was found to read before it, and lists the generations again
// after that look. A file opened before it had a first line takes the one
// it has now as its first life (see firstLife). And a copy made of what it
// held before the look (copytruncate, once the listing was taken) is
// listed now: it returns that generation, to be read first, or nil. Without
// the second listing the file would be taken as it is now, and what it held
// passed over, with no loss recorded.
func (f *Feed) lookBeforeTheMove(next *fileSource) (*fileSource, error) {
	fp, ok, err := f.look(next)
	if err != nil || !ok {
		return nil, err
	}
	if next.id.fp == "" {
		next.id.fp, next.openedAt, next.seen = fp, next.mtime, next.size
	}
	return f.nextGeneration(markOf(f.cur))
}

// grewBeforeRotation reports whether the current file, announced and no
// longer at the path, holds bytes past what was read, or started over in
// place, now that the feed has found the file that follows it: a writer moves on to the next file only
// after its last write to this one, so what it wrote between the feed's
// last look and that move is there now, and is read before the feed moves
// on (else it would be passed over unread, with no loss known).
func (f *Feed) grewBeforeRotation() (bool, error) {
	c := f.cur
	if c.epoch == "" {
		return f.firstLineBeforeRotation()
	}
	before := c.mtime
	size, err := c.stat()
	if err != nil {
		return false, err
	}
	// Started over in place since the look (copytruncate, then written
	// again, maybe to fewer bytes than were read): looked at again, so
	// that what it holds now is read under its next epoch, not passed over.
	// The look goes on from the time seen before the truncation, by which
	// its copy is chosen.
	if truncated, err := f.truncated(size); err != nil || truncated {
		c.mtime = before
		return truncated, err
	}
	if size <= c.split.fed() {
		return false, nil
	}
	c.saw(size)
	c.atEOF = false
	return true, nil
}

// firstLineBeforeRotation reports whether the current file, which had no
// first line at the feed's last look, has one now that the feed has found
// the file that follows it: the writer wrote it before it moved on (an
// empty file at the path, emptied by copytruncate, gets its lines and is
// then rotated away). It is then announced and read, not passed over with
// its lines unread. Without one, what it holds is a line that never
// completed, seen now (reported lost by switchTo).
func (f *Feed) firstLineBeforeRotation() (bool, error) {
	c := f.cur
	size, err := c.stat() // before the fingerprint: what it holds then has no first line
	if err != nil {
		return false, err
	}
	_, ok, err := c.fingerprint()
	if err != nil || ok {
		return ok, err
	}
	c.saw(size)
	return false, nil
}

// switchTo closes the current file, read to its end, and makes s the
// current one, announcing its epoch when it has a fingerprint. The
// fingerprint is read again: s may have been open for a while (the next
// file, a held one) and have started over in place since.
func (f *Feed) switchTo(s *fileSource) error {
	s, err := f.firstLife(s)
	if err != nil {
		return err
	}
	old := f.cur
	switch {
	case old.unread() && old.copyOf:
		// The copy was made, and the file truncated, in the middle of a
		// line: its end went to the file's next life.
		f.lose(cmp.Or(old.epoch, unannouncedEpoch(old)), old.split.pos, old.seen, LossCutByTruncation)
	case old.unread():
		f.lose(cmp.Or(old.epoch, unannouncedEpoch(old)), old.split.pos, old.seen, LossUnterminated)
	}
	f.log.Info("file rotated", logEpoch, old.epoch, logTo, old.split.pos, "next", s.file.Name())
	f.passed[inodeOf(old.id)] = true
	f.noteRead(old)
	f.cur = nil
	if s == f.next {
		f.next = nil
	}
	f.use(s)
	if s.id.fp != "" {
		f.announce(s)
	}
	return old.close()
}

// firstLife returns the file to switch to in place of s, the file that
// follows the current one, with its fingerprint read again and its size
// looked at: s itself, or the copy that holds what s held when it was
// opened, when s started over in place since (copytruncate) before any of
// it was read, or a copy of a later life of s made since the feed last
// listed the generations (see laterLifeCopy). The copy is read first, in
// its own identity, and s after it (s stays the next file, or is held).
// What s held is settled, with nothing read again, when a copy of it was
// read already in this run (see lifeRead), whether or not that copy is
// still beside the path; with no copy, read or there, it is a RecordLoss
// of unknown extent. On an error s is as it was.
func (f *Feed) firstLife(s *fileSource) (*fileSource, error) {
	first, before, seen := s.id, s.mtime, s.seen
	since := s.openedAt // a copy of what s held when opened is made after that
	fp, ok, err := f.look(s)
	if err != nil {
		s.mtime = before
		if s != f.next {
			f.held = append(f.held, s)
		}
		return nil, err
	}
	if !ok {
		fp = ""
	}
	f.log.Debug("looked at the file to move to", logFile, s.file.Name(), "first", first.String(),
		"seen", seen, "since", since.Format(time.StampMicro), "fingerprint", fp, "size", s.size)
	if first.fp == "" || fp == first.fp {
		s.id.fp, s.seen = fp, s.size
		return s, nil
	}
	if g, err := f.laterLifeCopy(s); err != nil || g != nil {
		s.mtime = before
		return g, err
	}
	if s.id.fp != first.fp {
		// A copy in the making of what s holds now was matched against it
		// in that listing (see anchor): its earlier lives are settled.
		return s, nil
	}
	want := copyWant{of: first, size: seen, since: since}
	settled := f.lifeRead(want)
	var cpy *fileSource
	if !settled {
		if cpy, err = f.findCopy(want); err != nil {
			s.mtime = before
			if s != f.next {
				f.held = append(f.held, s)
			}
			return nil, err
		}
	}
	f.log.Info("the next file started over in place before it was read", logFile, s.file.Name(), logEpoch, first.String())
	s.id.fp, s.seen = fp, s.size
	if s != f.next {
		f.held = append(f.held, s)
	}
	switch {
	case settled:
		f.log.Info("what it held was read already from a copy", logEpoch, first.String())
	case cpy != nil && !f.readHere(cpy.id):
		f.log.Info("reading what it held from its copy", logFile, cpy.file.Name())
		cpy.copyOf = true
		return cpy, nil
	case cpy != nil: // read already, as a generation of its own
		if err := cpy.close(); err != nil {
			return nil, err
		}
	default:
		f.lose(first.String(), 0, ingest.UnknownPosition, LossTruncated)
	}
	if fp == "" && s == f.next {
		// Emptied (copytruncate) and not written again yet: it stays the
		// next file, with no first life, until it has a first line (see
		// lookBeforeTheMove). Taken now, a life it gets, copied and
		// truncated again before the feed's next look, would be known
		// only by its copy, which nothing would tie to it.
		s.openedAt = s.mtime
		return nil, fmt.Errorf("the next file %s started over and has no first line yet: %w", s.file.Name(), errUnsettled)
	}
	f.unhold(s)
	return s, nil
}

// laterLifeCopy returns the generation to read before s, when s started
// over in place since the feed took its first life, from a listing taken
// after the look that showed it: copytruncate may have run more than once
// since the feed last listed the generations, and the copies of the lives
// between the first and the one s holds now are generations after the
// current file that no earlier listing held (the copy of the first life
// accounts for none of them). It returns nil when there is none, or when
// the first is s itself: s is then settled as firstLife says, and is not
// held. With a generation or an error, s stays the next file, or held,
// until its turn.
func (f *Feed) laterLifeCopy(s *fileSource) (*fileSource, error) {
	hold := func() {
		if s != f.next && !slices.Contains(f.held, s) {
			f.held = append(f.held, s)
		}
	}
	hold() // listed through the open file, never opened a second time
	g, err := f.nextGeneration(markOf(f.cur))
	if err != nil || g != nil && g != s {
		hold()
		if g != nil {
			f.log.Info("the next file started over in place more than once before it was read; a later life's copy is read first",
				logFile, g.file.Name())
		}
		return g, err
	}
	f.held = slices.DeleteFunc(f.held, func(h *fileSource) bool { return h == s })
	return nil, nil
}

// unannouncedEpoch is the identity a file that never had a first line is
// reported under: its device and inode, and the hash of what it held.
func unannouncedEpoch(s *fileSource) string {
	buf := make([]byte, min(s.seen, fingerprintSize))
	n, _ := s.file.ReadAt(buf, 0)
	id := s.id
	id.fp = hashHex(buf[:n])
	return id.String()
}

// upcoming returns the file now at the path when it is another file than
// the current one (opened once and kept in f.next), or nil with why there is
// none (missing, or it cannot be opened); here reports that the path still
// holds the current file.
func (f *Feed) upcoming() (next *fileSource, here bool, why, err error) {
	fi, err := statPath(f.path)
	if err != nil || fi == nil {
		return nil, false, cmp.Or(err, errMissing), nil
	}
	switch id := fileIDOf(fi); {
	case id.sameInode(f.cur.id):
		f.setWaiting(nil)
		return nil, true, nil, nil
	case f.next != nil && id.sameInode(f.next.id):
		return f.next, false, nil, nil
	}
	s, why := f.openPathFile()
	if s == nil {
		return nil, false, why, nil
	}
	f.setWaiting(nil)
	if s.id.sameInode(f.cur.id) { // the path changed again since the stat
		return nil, true, nil, s.close()
	}
	if f.next != nil {
		// Rotated away before its turn: kept open, it is read as a
		// generation even if deleted meanwhile.
		f.held = append(f.held, f.next)
	}
	f.next = s
	return s, false, nil, nil
}

// nextGeneration opens the oldest generation after m that can be read, and
// returns nil when none follows m. Compressed generations on the way are
// reported lost (LossCompressed, once each) and passed.
func (f *Feed) nextGeneration(m chainMark) (*fileSource, error) {
	for range listTries {
		gens, err := f.generations()
		if err != nil {
			return nil, err
		}
		f.forgetPassed(gens)
		if f.log.Enabled(context.Background(), slog.LevelDebug) {
			f.log.Debug("generations listed", "after", m.id.String(), "gens", listingText(gens))
		}
		renamed := false
		for _, g := range f.withHeld(m.after(f.markHeld(gens)), gens) {
			if f.passed[inodeOf(g.id)] {
				continue // read in this run already: ties in time can put it after the mark
			}
			copying, err := f.copyInProgress(g)
			if err != nil {
				return nil, err
			}
			if copying {
				f.log.Debug("a copy in the making of the next file: its lines are read there", logFile, g.name)
				continue
			}
			if g.compressed {
				f.loseCompressed(g, "", 0)
				continue
			}
			s, err := openGeneration(g, f.opts.MaxLine)
			if err != nil {
				return nil, err
			}
			if s == nil {
				renamed = true
				break
			}
			if writing, err := f.beingWritten(s); err != nil || writing {
				if s != g.held {
					err = errors.Join(err, s.close())
				}
				if writing {
					err = errors.Join(errUnsettled, err)
				}
				return nil, err
			}
			f.unhold(s)
			return s, nil
		}
		if !renamed {
			return nil, nil
		}
		f.log.Debug("a generation was renamed between the listing and its opening: listing again")
	}
	// Every listing was stale by the time a generation was opened: that
	// none was opened says nothing (taken for none, the generation would be
	// passed over unread, with no loss known).
	return nil, fmt.Errorf("open the next generation of %s: %w", f.path, errUnsettled)
}

// listingText formats a listing for a debug log: each generation's name,
// inode, size and modification time, oldest first.
func listingText(gens []generation) string {
	var b strings.Builder
	for _, g := range gens {
		fmt.Fprintf(&b, "%s=%d/%d/%s ", filepath.Base(g.name), g.id.ino, g.size, g.mtime.Format(time.StampMicro))
	}
	return b.String()
}

// copyInProgress reports whether g holds nothing but a prefix of the file
// at the path (f.next): a copy being made of it, or made before a
// copytruncate truncates it. Its lines are the file's own, read there; once
// the file is truncated, the copy is found as one (see findCopy). Read as a
// generation of its own, they would be read twice.
func (f *Feed) copyInProgress(g generation) (bool, error) {
	if g.compressed || g.held != nil {
		return false, nil
	}
	if f.next == nil && f.cur != nil {
		// The path was missing when the feed looked (renamed, not yet made
		// again); a file made there since, and copied already, is the one
		// this may be a copy of.
		if _, _, _, err := f.upcoming(); err != nil {
			return false, err
		}
	}
	if f.next == nil {
		return false, nil
	}
	// The size as seen now: the file at the path may have grown since it
	// was opened, and a copy of it as it is now is larger than it was then.
	// Its fingerprint is read before the bytes are compared: if it starts
	// over after the comparison, that fingerprint is what shows it.
	fp, ok, err := f.look(f.next)
	if err != nil || g.size > f.next.size {
		return false, err
	}
	same, err := f.prefixOfNext(g)
	if err != nil || !same || !ok {
		return same, err // no first line in either: nothing to anchor
	}
	return f.anchor(f.next, fp)
}

// prefixOfNext reports whether g holds nothing but a prefix of f.next.
func (f *Feed) prefixOfNext(g generation) (bool, error) {
	s, err := openGeneration(g, f.opts.MaxLine)
	if err != nil || s == nil {
		return false, err
	}
	defer s.close()
	head := min(s.size, compareMax)
	same, err := sameBytes(s, f.next, 0, head)
	if err != nil || !same || head == s.size {
		return same, err
	}
	return sameBytes(s, f.next, max(s.size-tailSize, head), s.size)
}

// anchor makes what next holds now (fingerprint fp, size and time as just
// looked at) its first life, once a copy of it was matched against it: the
// feed leaves the copy's lines to next, so if next starts over before the
// feed gets to it, firstLife must look for the copy of this life, not of
// the one next held when it was opened (an empty file, or a life copied and
// truncated since: copytruncate may run again and again before the feed
// gets to next). That earlier life is settled first, as firstLife would:
// its copy read already (see lifeRead: the copy may be gone since), or none
// (a RecordLoss of unknown extent). When its
// copy is there unread, next keeps its first life, to be read from that
// copy. It reports whether the copy just matched is left to next.
func (f *Feed) anchor(next *fileSource, fp string) (bool, error) {
	if next.id.fp != "" && next.id.fp != fp {
		want := copyWant{of: next.id, size: next.seen, since: next.openedAt}
		if f.lifeRead(want) {
			next.id.fp, next.openedAt, next.seen = fp, next.mtime, next.size
			return true, nil // read already from a copy: settled
		}
		cpy, err := f.findCopy(want)
		switch {
		case err != nil:
			return false, err
		case cpy != nil && !f.readHere(cpy.id):
			return true, cpy.close()
		case cpy != nil:
			if err := cpy.close(); err != nil {
				return false, err
			}
		default:
			f.log.Info("the next file started over in place before it was read", logFile, next.file.Name(), logEpoch, next.id.String())
			f.lose(next.id.String(), 0, ingest.UnknownPosition, LossTruncated)
		}
	}
	if next.id.fp != fp {
		next.id.fp, next.openedAt, next.seen = fp, next.mtime, next.size
	}
	return true, nil
}

// look reads s's fingerprint with its size and time (see fileSource.look).
func (f *Feed) look(s *fileSource) (string, bool, error) {
	if f.looking == nil {
		return s.look(nil)
	}
	f.looking(s, false)
	return s.look(func() { f.looking(s, true) })
}

// beingWritten reports whether s, the next generation, has no first line
// yet and was modified within the look gap: a copy being written
// (copytruncate writes it after creating it), not a file that ended
// without one. Taken now, it would be passed over unread (see
// announceCurrent); it is looked at again later instead.
func (f *Feed) beingWritten(s *fileSource) (bool, error) {
	if _, ok, err := s.fingerprint(); err != nil || ok {
		return false, err
	}
	if _, err := s.stat(); err != nil {
		return false, err
	}
	return time.Since(s.mtime) < f.lookGap, nil
}

// inodeOf is id without its fingerprint: the key of a file on disk.
func inodeOf(id fileID) fileID { return fileID{dev: id.dev, ino: id.ino} }

// forgetPassed drops from the files read (or reported lost) in this run
// those no longer listed: once gone, their inodes may be reused by new files.
func (f *Feed) forgetPassed(gens []generation) {
	for _, set := range []map[fileID]bool{f.passed, f.lostGens} {
		for id := range set {
			if !slices.ContainsFunc(gens, func(g generation) bool { return g.id.sameInode(id) }) {
				delete(set, id)
			}
		}
	}
}

// markHeld marks the generations the feed has open already (held files, and
// f.next once rotated away: the listing leaves out only the file at the
// path), so that they are read through the open file.
func (f *Feed) markHeld(gens []generation) []generation {
	for i := range gens {
		for _, h := range append([]*fileSource{f.next}, f.held...) {
			if h != nil && gens[i].id.sameInode(h.id) {
				gens[i].held = h
			}
		}
	}
	return gens
}

// withHeld adds to after, the generations after the current file, the held
// files the listing does not have (deleted since they were at the path), by
// their modification time: each was at the path after the current file was,
// so it follows the current file whatever its time.
func (f *Feed) withHeld(after, listed []generation) []generation {
	for _, h := range f.held {
		if slices.ContainsFunc(listed, func(g generation) bool { return g.id.sameInode(h.id) }) {
			continue
		}
		if _, err := h.stat(); err != nil {
			continue
		}
		g := generation{name: h.file.Name(), id: h.id, size: h.size, mtime: h.mtime, held: h}
		i := 0
		for i < len(after) && !after[i].mtime.After(g.mtime) {
			i++
		}
		after = slices.Insert(slices.Clone(after), i, g)
	}
	return after
}

// unhold forgets s as a held file (or the next one), once it is read.
func (f *Feed) unhold(s *fileSource) {
	f.held = slices.DeleteFunc(f.held, func(h *fileSource) bool { return h == s })
	if f.next == s {
		f.next = nil
	}
}

// loseCompressed reports the compressed generation g lost, once: in epoch
// (from from) when it holds the rest of that epoch's file, else in its own
// identity from 0.
func (f *Feed) loseCompressed(g generation, epoch string, from int64) {
	key := inodeOf(g.id)
	if f.lostGens[key] {
		return
	}
	f.lostGens[key] = true
	if epoch == "" {
		epoch = compressedEpoch(g)
	}
	f.log.Warn("generation compressed before it was read; compressed files are not read", logFile, g.name)
	f.lose(epoch, from, ingest.UnknownPosition, LossCompressed)
}
