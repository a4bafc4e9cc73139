package filefeed

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/outboxd/outboxd/ingest"
)

// Why the feed waits for its path.
var (
	errMissing    = errors.New("no such file")
	errIsDir      = errors.New("is a directory, not a file")
	errNotRegular = errors.New("not a regular file")
)

// Check tells whether path can be followed as a file feed, before a server
// starts one on it: nil for a readable regular file, or for a missing file
// whose directory exists (the feed waits for it). Otherwise it returns a
// one-line error naming the path: a directory or another non-regular file at
// the path, a file that cannot be opened for reading, a directory that does
// not exist, is not a directory or cannot be listed (rotated generations are
// found by listing it).
func Check(path string) error {
	dir := filepath.Dir(path)
	if err := checkDir(dir); err != nil {
		return fmt.Errorf("file feed %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("file feed %s: %w", path, cause(err))
	case fi.IsDir():
		return fmt.Errorf("file feed %s: %w", path, errIsDir)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("file feed %s: %w (%s)", path, errNotRegular, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("file feed %s: cannot be read: %w", path, cause(err))
	}
	return f.Close()
}

// checkDir checks that dir is a directory that can be listed.
func checkDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("directory %s: %w", dir, cause(err))
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return fmt.Errorf("directory %s: %w", dir, cause(err))
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if _, err := d.ReadDir(1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("directory %s cannot be listed: %w", dir, cause(err))
	}
	return nil
}

// cause returns the reason inside an error about the path ("permission
// denied"), so that a message names its path once.
func cause(err error) error {
	var pe *fs.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errMissing
	case errors.Is(err, errIsDir):
		return errIsDir
	case errors.Is(err, errNotRegular):
		return errNotRegular
	case errors.As(err, &pe):
		return pe.Err
	}
	return err
}

// Waiting returns why the feed is waiting for its file, as one line
// ("waiting for ./x.csv: no such file"), or "" when it is not waiting: the
// path exists and can be opened, or the feed still has a file to read. It is
// safe for concurrent use.
func (f *Feed) Waiting() string {
	if r := f.waiting.Load(); r != nil {
		return *r
	}
	return ""
}

var _ ingest.Waiter = (*Feed)(nil)

// setWaiting records why the path cannot be read (nil: it can). It logs a
// warning when the feed starts waiting or the reason changes, and an info
// line when the file is there again.
func (f *Feed) setWaiting(why error) {
	reason := ""
	if why != nil {
		reason = fmt.Sprintf("waiting for %s: %v", f.path, cause(why))
	}
	old := f.Waiting()
	if old == reason {
		return
	}
	if reason == "" {
		f.waiting.Store(nil)
		f.log.Info("file is there: reading it")
		return
	}
	f.waiting.Store(&reason)
	f.log.Warn("waiting for the file", "reason", reason)
}

// openAtPath opens the file at the path, or returns nil when it is missing
// or cannot be opened: the feed waits for it then (see Waiting).
func (f *Feed) openAtPath() *fileSource {
	s, why := f.openPathFile()
	f.setWaiting(why)
	return s
}

// openPathFile opens the file at the path, or returns nil and why it cannot.
func (f *Feed) openPathFile() (*fileSource, error) {
	s, err := openFileSource(f.path, f.opts.MaxLine)
	switch {
	case err != nil:
		return nil, err
	case s == nil:
		return nil, errMissing
	}
	return s, nil
}
