package filefeed

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// copyWant describes the copy of a file that started over in place.
type copyWant struct {
	of    fileID    // the file: the copy has its fingerprint, on another inode
	pos   int64     // where reading stood in it: the copy is read on from there
	size  int64     // what was seen of the file: the copy holds at least this much
	tail  []byte    // the bytes the copy holds just before pos (see holds)
	since time.Time // when the file was last seen intact
	// madeSince takes only a copy modified since since, never one older of
	// the size seen.
	madeSince bool
	// lone takes the only match, whatever its time and size: opened from a
	// checkpoint, since is when the checkpoint was stored, not when the
	// file was last seen, and a copy made between the two (of a file grown
	// since it was seen) is older than since and longer than size.
	lone bool
}

// findCopy returns the copy of the file want describes, opened, or nil. A
// copy is a generation of the path (see listGenerations), not compressed, on
// another inode than the file, with the file's fingerprint, at least as long
// as the position and what was seen, and holding tail just before the
// position: running, the end of the last line read; opened from a
// checkpoint, a "\n" (a line ended there). Copies of earlier epochs (an
// earlier copytruncate) may match that too when lines repeat: of the
// matches, the oldest modified since want.since is the copy (a copy made or
// written to after the file was last seen intact), else the newest whose
// size is exactly what was seen (a copy of the file as seen, modified
// before: a copy keeping the file's time, of a file not written since),
// else, with want.lone, the only match. When a rotation renamed a candidate
// between the listing and its opening on every try, the error wraps
// errUnsettled.
func (f *Feed) findCopy(want copyWant) (*fileSource, error) {
	for range listTries {
		matches, renamed, err := f.copies(want)
		if err != nil || renamed {
			if err := errors.Join(err, closeAll(matches, nil)); err != nil {
				return nil, err
			}
			continue // a rotation renamed a candidate since the listing: list again
		}
		chosen := chooseCopy(matches, want)
		return chosen, closeAll(matches, chosen)
	}
	// Every listing was stale by the time a candidate was opened: that no
	// copy was found says nothing (taken for none, the rest of the file
	// would be reported lost, or passed over unread).
	return nil, fmt.Errorf("find the copy of %s: %w", want.of, errUnsettled)
}

// copies returns the generations that match want, opened, oldest first;
// renamed reports that one was renamed between the listing and its opening.
func (f *Feed) copies(want copyWant) (matches []*fileSource, renamed bool, err error) {
	gens, err := f.generations()
	if err != nil {
		return nil, false, err
	}
	for _, g := range gens {
		if g.compressed || g.held != nil || g.id.sameInode(want.of) || g.size < max(want.pos, want.size) {
			continue
		}
		s, moved, err := f.openCopy(g, want)
		if err != nil || moved {
			return matches, moved, err
		}
		if s != nil {
			matches = append(matches, s)
		}
	}
	return matches, false, nil
}

// readHere reports whether the file on id's inode is being read, or was
// read to its end in this run: a copy read as a generation of its own
// before its file started over is not read again as that file's copy.
func (f *Feed) readHere(id fileID) bool {
	return f.passed[inodeOf(id)] || f.cur != nil && f.cur.id.sameInode(id)
}

// closeAll closes the files of matches but keep.
func closeAll(matches []*fileSource, keep *fileSource) error {
	var errs []error
	for _, m := range matches {
		if m != keep {
			errs = append(errs, m.close())
		}
	}
	return errors.Join(errs...)
}

// openCopy opens g and returns it when it is a copy of want's file; moved
// reports that g's name holds another file now.
func (f *Feed) openCopy(g generation, want copyWant) (s *fileSource, moved bool, err error) {
	s, err = openGeneration(g, f.opts.MaxLine)
	if err != nil || s == nil {
		return nil, err == nil, err
	}
	if s.id.fp != want.of.fp {
		return nil, false, s.close()
	}
	ok, err := s.holds(want.tail, want.pos)
	if err != nil || !ok {
		return nil, false, errors.Join(err, s.close())
	}
	return s, false, nil
}

// chooseCopy picks the copy among matches (oldest first), as findCopy says.
func chooseCopy(matches []*fileSource, want copyWant) *fileSource {
	for _, m := range matches {
		if !m.mtime.Before(want.since) {
			return m
		}
	}
	for i := len(matches) - 1; i >= 0 && !want.madeSince; i-- {
		if matches[i].size == want.size {
			return matches[i]
		}
	}
	if want.lone && !want.madeSince && len(matches) == 1 {
		return matches[0]
	}
	return nil
}

// maxReadLives bounds Feed.readLives. A next file's first life is read from
// its copy just before the feed moves to the file, with at most the held
// files read between: the lives kept reach far past that.
const maxReadLives = 64

// readLife is what the feed read of a file, from 0 in its own epoch: its
// identity with its fingerprint, how far it was read (the end of its last
// complete line), and its modification time as last seen.
type readLife struct {
	id    fileID
	read  int64
	mtime time.Time
}

// lifeOf is what the feed has read of s, when s was read from 0 in its own
// epoch (as a generation, or as the copy of a next file's first life); ok
// is false for a copy read on from a position in another file's epoch.
func lifeOf(s *fileSource) (readLife, bool) {
	if s.id.fp == "" || s.epoch != s.id.String() {
		return readLife{}, false
	}
	return readLife{id: s.id, read: s.split.pos, mtime: s.mtime}, true
}

// noteRead keeps what the feed read of s, read to its end, among the lives
// lifeRead looks at.
func (f *Feed) noteRead(s *fileSource) {
	l, ok := lifeOf(s)
	if !ok {
		return
	}
	if len(f.readLives) == maxReadLives {
		f.readLives = slices.Delete(f.readLives, 0, 1)
	}
	f.readLives = append(f.readLives, l)
}

// lifeRead reports whether the life want describes (a next file's first
// life: want.pos 0) was read already in this run from a copy of it: a file
// read from 0 in its own epoch (the current one, or one read to its end
// before), on another inode than the file, with its fingerprint, read past
// what the feed saw of the life, and modified since the feed took the life
// as the file's (so not an older generation that starts with the same
// line). Such a life is settled: its copy deleted, compressed or renamed
// away after it was read takes nothing unread with it, and no copy listed
// now is read again for it. A copy that went before it was read is no
// read life, and stays a loss.
func (f *Feed) lifeRead(want copyWant) bool {
	lives := f.readLives
	if f.cur != nil {
		if l, ok := lifeOf(f.cur); ok {
			lives = append(slices.Clip(lives), l)
		}
	}
	return slices.ContainsFunc(lives, func(l readLife) bool {
		return l.id.fp == want.of.fp && !l.id.sameInode(want.of) &&
			l.read >= want.size && !l.mtime.Before(want.since)
	})
}
