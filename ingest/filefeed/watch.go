package filefeed

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// startWatch starts watching the path's directory for new, renamed and
// written files. Without a watcher the feed still looks every PollInterval.
func (f *Feed) startWatch() {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		f.log.Warn("file watch unavailable, polling only", logErr, err)
		return
	}
	f.watcher = w
	f.wg.Add(1)
	go f.relayEvents(w)
	f.watchDir()
}

// watchDir watches the path's directory, once it exists.
func (f *Feed) watchDir() {
	if f.watcher == nil || f.dirWatched {
		return
	}
	dir := filepath.Dir(f.path)
	if err := f.watcher.Add(dir); err != nil {
		f.log.Debug("cannot watch directory yet", "dir", dir, logErr, err)
		return
	}
	f.dirWatched = true
}

// watchFile watches the file open as name (again: a watch follows an inode,
// and the name may now be another inode's). It is best effort: the directory
// watch and polling cover what it misses.
func (f *Feed) watchFile(name string) {
	if f.watcher == nil {
		return
	}
	f.watchDir()
	if err := f.watcher.Add(name); err != nil {
		f.log.Debug("cannot watch file", "file", name, logErr, err)
	}
}

// relayEvents turns watcher events into wake-ups until the watcher closes.
func (f *Feed) relayEvents(w *fsnotify.Watcher) {
	defer f.wg.Done()
	for {
		select {
		case _, ok := <-w.Events:
			if !ok {
				return
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			f.log.Warn("file watch error", logErr, err)
		}
		select {
		case f.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// wait returns after a file-system event, PollInterval, ctx's end (with
// ctx.Err()) or Close (with an error wrapping fs.ErrClosed).
func (f *Feed) wait(ctx context.Context) error {
	t := time.NewTimer(f.opts.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-f.done:
		return fmt.Errorf("poll %s: %w", f.path, fs.ErrClosed)
	case <-f.wake:
	case <-t.C:
	}
	return nil
}
