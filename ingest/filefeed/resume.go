package filefeed

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/outboxd/outboxd/outbox"
)

// resume positions the feed after cp, the stored checkpoint of partition 0.
func (f *Feed) resume(cp outbox.Checkpoint) error {
	f.prev = cp.Epoch
	stored, ok := parseFileEpoch(cp.Epoch)
	s, err := openFileSource(f.path, f.opts.MaxLine)
	if err != nil {
		return err
	}
	if ok && s != nil && s.id.sameInode(stored.id) && (s.id.fp == stored.id.fp || s.id.fp == "" || s.size < cp.Position) {
		return f.resumeSame(s, stored, cp)
	}
	return f.resumeElsewhere(s, stored, cp)
}

// resumeSame resumes in the file on the checkpoint's inode: after the
// checkpoint's position when it still has the checkpoint's fingerprint and
// holds the position; otherwise (it is shorter than the position or than its
// first line: truncated while the feed was stopped) from 0 under a new epoch,
// after a RecordLoss for what had been seen past the position.
func (f *Feed) resumeSame(s *fileSource, stored fileEpoch, cp outbox.Checkpoint) error {
	f.use(s)
	if s.id.fp == stored.id.fp && s.size >= cp.Position {
		s.epoch = cp.Epoch
		return s.seek(cp.Position)
	}
	if cp.End > cp.Position {
		f.lose(cp.Epoch, cp.Position, cp.End, LossTruncated)
	}
	return nil
}

// resumeElsewhere handles a path that holds another file than the
// checkpoint's, or none. The checkpoint's file, when found beside the path (a
// rotation renamed it), is read to its end first; otherwise what may have
// followed the position is reported lost. s is the file at the path, if any.
func (f *Feed) resumeElsewhere(s *fileSource, stored fileEpoch, cp outbox.Checkpoint) error {
	old, err := f.findPrevious(stored, cp.Position)
	if err != nil {
		return errors.Join(err, f.closeSource(s))
	}
	if old != nil {
		f.log.Info("resuming in the rotated file", "file", old.file.Name(), logEpoch, cp.Epoch)
		old.epoch = cp.Epoch
		f.use(old)
		f.next = s
		return old.seek(cp.Position)
	}
	f.lose(cp.Epoch, cp.Position, max(cp.Position, cp.End), LossReplaced)
	if s != nil {
		f.use(s)
	}
	return nil
}

// findPrevious looks in the path's directory for the file whose identity is
// the stored epoch's and that holds at least pos bytes. It returns nil when
// there is none.
func (f *Feed) findPrevious(stored fileEpoch, pos int64) (*fileSource, error) {
	if stored.id.fp == "" {
		return nil, nil // not an epoch of this feed kind: nothing to look for
	}
	dir := filepath.Dir(f.path)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		s, err := f.openIfSame(filepath.Join(dir, e.Name()), stored.id, pos)
		if err != nil || s != nil {
			return s, err
		}
	}
	return nil, nil
}

// openIfSame opens the file name when its identity is id and it holds at
// least pos bytes, and returns nil otherwise.
func (f *Feed) openIfSame(name string, id fileID, pos int64) (*fileSource, error) {
	fi, err := os.Stat(name)
	if err != nil || !fileIDOf(fi).sameInode(id) {
		return nil, nil // gone since the listing, or another file
	}
	s, err := openFileSource(name, f.opts.MaxLine)
	if err != nil || s == nil {
		return nil, err
	}
	if s.id != id || s.size < pos {
		return nil, s.close()
	}
	return s, nil
}
