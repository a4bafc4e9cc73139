package filefeed

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// fileReadSize is the size of a file source's reusable read buffer: one read
// syscall serves many lines.
const fileReadSize = 64 << 10

// fileSource is one open file a Feed reads, with where it stands in it.
type fileSource struct {
	file  *os.File
	id    fileID
	epoch string // "" until announced (or resumed): no item is read before
	split *lineSplitter
	buf   []byte // the read buffer, handed to split chunk by chunk
	fpBuf []byte // the buffer fingerprints are read into
	size  int64  // the file's size as last seen
	seen  int64  // the largest size seen in this epoch: what a loss runs to
	atEOF bool   // the last read found the end: look at the file before reading on

	mtime time.Time // the modification time as last seen
	// openedAt is the modification time when the feed took the file's
	// fingerprint (id.fp) as its first life: when it was opened, or when a
	// copy of it was matched against it since (see Feed.copyInProgress).
	openedAt time.Time
	lookedAt time.Time // when the feed last looked at the file's size (the feed's clock)
	// mods is Feed.mods as of the feed's last look at the file's size, and
	// watches how many watches report its writes (see Feed.watchFile).
	mods    int64
	watches int
	// copyOf: the file is the copy of a file that started over in place,
	// read for what that file held (see Feed.readCopy, Feed.firstLife).
	copyOf bool
	last   fileLine // the last complete line read: evidence of what ends at split.pos
	// restartOf is the epoch the file had before it started over in place,
	// when the feed read the rest of that epoch from a copy first: the new
	// epoch's generation counts on from it.
	restartOf string
	tailBuf   []byte // reused to compare the bytes before split.pos
}

// openFileSource opens the file at path, with its identity (the fingerprint
// too, when the file has one yet). It returns nil and no error when there is
// no file.
func openFileSource(path string, maxLine int) (*fileSource, error) {
	file, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s, err := newFileSource(file, maxLine)
	if err != nil {
		file.Close()
		return nil, err
	}
	return s, nil
}

func newFileSource(file *os.File, maxLine int) (*fileSource, error) {
	fi, err := file.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", file.Name(), err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("open %s: %w", file.Name(), errIsDir)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open %s: %w", file.Name(), errNotRegular)
	}
	s := &fileSource{
		file:  file,
		id:    fileIDOf(fi),
		split: newLineSplitter(maxLine, 0),
		buf:   make([]byte, fileReadSize),
		fpBuf: make([]byte, fingerprintSize),
		size:  fi.Size(),
		seen:  fi.Size(),
		mtime: fi.ModTime(),
	}
	s.openedAt = s.mtime
	fp, ok, err := s.fingerprint()
	if err != nil {
		return nil, err
	}
	if ok {
		s.id.fp = fp
	}
	return s, nil
}

// fingerprint reads the file's current fingerprint; ok is false while it has
// none.
func (s *fileSource) fingerprint() (fp string, ok bool, err error) {
	return readFingerprint(s.file, s.fpBuf)
}

// look reads the file's fingerprint, with its size and modification time
// (s.size, s.mtime) taken just before, never after: a copytruncate between
// the two would otherwise pair the fingerprint of what the file held with
// the size and time of what it holds next, and the copy of what it held
// (older, maybe shorter) would no longer match. A file that shrank between
// the stat and a second one just after the fingerprint started over while it
// was looked at; it is looked at again, and past listTries tries the error
// wraps errUnsettled.
// fingerprinted, when not nil, is called just after each fingerprint read.
func (s *fileSource) look(fingerprinted func()) (fp string, ok bool, err error) {
	for range listTries {
		size, err := s.stat()
		if err != nil {
			return "", false, err
		}
		mtime := s.mtime
		fp, ok, err = s.fingerprint()
		if err != nil {
			return "", false, err
		}
		if fingerprinted != nil {
			fingerprinted()
		}
		after, err := s.stat()
		if err != nil {
			return "", false, err
		}
		s.size, s.mtime = size, mtime
		if after >= size {
			return fp, ok, nil
		}
	}
	return "", false, fmt.Errorf("look at %s: %w", s.file.Name(), errUnsettled)
}

// seek makes the next read start at pos, dropping any unfinished line.
func (s *fileSource) seek(pos int64) error {
	if _, err := s.file.Seek(pos, io.SeekStart); err != nil {
		return fmt.Errorf("seek %s to %d: %w", s.file.Name(), pos, err)
	}
	s.split.reset(pos)
	s.atEOF = false
	return nil
}

// stat looks at the file's size again. The caller decides whether the size
// counts as seen in this epoch (see saw): not when the file started over.
func (s *fileSource) stat() (int64, error) {
	fi, err := s.file.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", s.file.Name(), err)
	}
	s.size, s.mtime = fi.Size(), fi.ModTime()
	return s.size, nil
}

// saw notes that the file had at least size bytes.
func (s *fileSource) saw(size int64) { s.seen = max(s.seen, size) }

// next returns the next complete line, reading the file a chunk at a time as
// needed; ok is false at the end of the file.
func (s *fileSource) next() (l fileLine, ok bool, err error) {
	for {
		if l, ok := s.split.next(); ok {
			s.last = l
			return l, true, nil
		}
		n, err := s.file.Read(s.buf)
		if n > 0 && !s.sameStart() {
			// Truncated (and written again) while it was read: these bytes
			// may be the new content's, past its own start. Drop them and
			// let the next look see the truncation.
			s.atEOF = true
			return fileLine{}, false, nil
		}
		if n > 0 {
			s.split.push(s.buf[:n])
			s.size = max(s.size, s.split.fed())
			s.saw(s.size)
			continue
		}
		if err == nil || errors.Is(err, io.EOF) {
			s.atEOF = true
			return fileLine{}, false, nil
		}
		return fileLine{}, false, fmt.Errorf("read %s: %w", s.file.Name(), err)
	}
}

// sameStart reports whether the file still starts with the first line it
// had when its epoch began. Checked after each read that returned bytes: a
// chunk read before a truncation is the file's; one read (even partly)
// after it shows, since the file then starts otherwise (or is empty). A
// file truncated and written again with the same first line is the limit
// of what a look can tell.
func (s *fileSource) sameStart() bool {
	fp, ok, err := s.fingerprint()
	return err == nil && ok && fp == s.id.fp
}

// unread reports whether bytes were seen past the last complete line.
func (s *fileSource) unread() bool { return s.seen > s.split.pos }

// tailSize bounds the bytes of the last line compared by holds.
const tailSize = 64

// lastLineTail returns the bytes the file held just before split.pos, as far
// as the feed knows them: the end of the last line read (at most tailSize
// bytes of it) with its "\r\n" or "\n"; just "\n" when the line was longer
// than the limit (its end was never kept) or when no line was read in this
// run but the position follows one; nothing at position 0.
func (s *fileSource) lastLineTail() []byte {
	pos := s.split.pos
	if pos == 0 {
		return nil
	}
	if s.last.end != pos || s.last.tooLong {
		return []byte{'\n'}
	}
	v := s.last.value[max(len(s.last.value)-tailSize, 0):]
	tail := append(make([]byte, 0, len(v)+2), v...)
	if s.last.cr {
		tail = append(tail, '\r')
	}
	return append(tail, '\n')
}

// holds reports whether the file holds tail just before pos: the bytes the
// feed read there are still there, so it did not start over in place.
func (s *fileSource) holds(tail []byte, pos int64) (bool, error) {
	if len(tail) == 0 {
		return true, nil
	}
	start := pos - int64(len(tail))
	if start < 0 {
		return false, nil
	}
	if cap(s.tailBuf) < len(tail) {
		s.tailBuf = make([]byte, tailSize+2)
	}
	buf := s.tailBuf[:len(tail)]
	n, err := s.file.ReadAt(buf, start)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read %s at %d: %w", s.file.Name(), start, err)
	}
	return bytes.Equal(buf[:n], tail), nil
}

func (s *fileSource) close() error {
	if err := s.file.Close(); err != nil {
		return fmt.Errorf("close %s: %w", s.file.Name(), err)
	}
	return nil
}
