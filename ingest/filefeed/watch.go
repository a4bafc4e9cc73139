package filefeed

import (
	"context"
	"errors"
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
// and the name may now be another inode's), and counts its write events
// from now on (see Feed.mods). It is best effort: the directory watch and
// polling cover what it misses. It returns how many watches report the
// file's writes under name: its directory's and its own.
func (f *Feed) watchFile(name string) int {
	clean := filepath.Clean(name)
	f.modName.Store(&clean)
	if f.watcher == nil {
		return 0
	}
	f.watchDir()
	n := 0
	if f.dirWatched && filepath.Dir(name) == filepath.Dir(f.path) {
		n++
	}
	if err := f.watcher.Add(name); err != nil {
		f.log.Debug("cannot watch file", "file", name, logErr, err)
		return n
	}
	return n + 1
}

// overflowMods is what a lost queue of events (the kernel's queue
// overflowed) adds to Feed.mods: more than any look accounts for.
const overflowMods = 1 << 40

// countEvent counts ev in Feed.mods when it is a write to the file the
// feed reads, under the name it watches it by.
func (f *Feed) countEvent(ev fsnotify.Event) {
	if name := f.modName.Load(); name != nil && ev.Has(fsnotify.Write) && filepath.Clean(ev.Name) == *name {
		f.mods.Add(1)
	}
}

// relayEvents turns watcher events into wake-ups until the watcher closes.
func (f *Feed) relayEvents(w *fsnotify.Watcher) {
	defer f.wg.Done()
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			f.countEvent(ev)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				f.mods.Add(overflowMods) // writes may be among the events lost
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
