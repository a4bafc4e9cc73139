// Package filefeed is the tailed-file feed: an ingest.Feed over a file of
// "\n"-terminated lines, followed through appends, truncation and rotation
// (see Feed), with the file's identity as its epoch. It owns fsnotify.
package filefeed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Defaults of Options.
const (
	DefaultMaxLine      = 1 << 20
	DefaultPollInterval = 250 * time.Millisecond
)

// Reasons a file feed gives for a RecordLoss.
const (
	// LossTruncated: the file was truncated in place after bytes past the
	// last delivered line were seen (running: its largest size seen; opened
	// from a checkpoint: the checkpoint's End).
	LossTruncated = "truncated before read"
	// LossReplaced: opened from a checkpoint, the checkpoint's file is neither
	// at the path nor beside it; whatever followed the position is gone.
	LossReplaced = "file replaced while stopped; previous file not found"
	// LossUnterminated: a rotated file ended with bytes after its last "\n",
	// a line that never completed.
	LossUnterminated = "rotated away with an unterminated last line"
)

// Log keys of the file feed.
const (
	logEpoch = "epoch"
	logFrom  = "from"
	logTo    = "to"
	logErr   = "err"
)

// Options configures a Feed. Zero fields take their defaults.
type Options struct {
	// MaxLine is the longest line delivered whole, in bytes, without its
	// "\n" and a trailing "\r" (default DefaultMaxLine). A longer line is
	// yielded cut to MaxLine bytes with BadReason ReasonTooLong; the feed never
	// holds more than MaxLine bytes of it.
	MaxLine int
	// PollInterval is how often the file is looked at when no file-system
	// event wakes the feed (default DefaultPollInterval): events are missed
	// on some file systems and in some rotations.
	PollInterval time.Duration
	// Logger receives the feed's logs (default slog.Default()).
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.MaxLine <= 0 {
		o.MaxLine = DefaultMaxLine
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Feed tails a file of "\n"-terminated lines, following it through
// appends, truncation (copytruncate) and rotation (rename or delete, then
// create). It has one partition, 0.
//
// Each complete line is an item: Value is the line without its "\n" and a
// trailing "\r", Key is nil, Position is the byte offset just after the
// "\n". A trailing line without "\n" waits for it. An empty line is an item
// with an empty Value.
//
// The epoch is the identity of the file read, "dev:inode:fingerprint" (the
// fingerprint: hex FNV-64a of the first line with its "\n", or of the first
// 1024 bytes when no "\n" comes within them), with ":tN" appended when the
// same inode started over: the N-th truncation in place (or reuse of the
// inode) seen by the feed. So a new epoch never equals the one before it.
// Until a file has a first line (or 1024 bytes) it has no epoch, and nothing
// is yielded from it.
//
// Running, a Feed reads a rotated file to its end (its tail in its own
// epoch), then announces the new file's epoch and reads it from 0. A file
// truncated in place gets a new epoch read from 0; bytes it had been seen to
// hold and that were never read are yielded as a RecordLoss. Opened from a
// checkpoint, it finds the file again (at the path, or beside it in the
// directory after a rotation) and seeks; what it cannot find it reports as a
// RecordLoss. Nothing already delivered is read again. What no look can
// tell goes unnoticed: a file truncated and written again past the read
// position, with the same first line, between two looks (or while stopped).
//
// Open, Poll, Commit and Close are called from one goroutine, except that
// Close may be called while Poll waits, to end it. Ends may be called from any
// goroutine.
type Feed struct {
	path string
	opts Options
	log  *slog.Logger

	mu      sync.Mutex // held by Poll while it reads, and by Close
	opened  bool
	closed  bool
	cur     *fileSource     // the file read; nil until one exists
	next    *fileSource     // the file now at the path, while cur is drained
	prev    string          // the last epoch announced or resumed
	pending []ingest.Record // epochs and losses to yield before more lines
	failed  error           // an error to return from the next Poll

	end        atomic.Int64
	found      atomic.Bool // a file was found at the path since Open
	watcher    *fsnotify.Watcher
	dirWatched bool
	wake       chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup
}

var (
	_ ingest.Feed   = (*Feed)(nil)
	_ ingest.Waiter = (*Feed)(nil)
)

// Waiting says, until a file first appears at the path, that the feed
// waits for it (a path mistyped, or a file its writer has not created
// yet); "" once it has one. It does not block.
func (f *Feed) Waiting() string {
	if f.found.Load() {
		return ""
	}
	return "waiting for " + f.path + " to be created"
}

// New returns a feed on the file at path. The file need not exist
// yet. Nothing is opened before Open.
func New(path string, opts Options) *Feed {
	opts = opts.withDefaults()
	return &Feed{
		path: path,
		opts: opts,
		log:  opts.Logger.With("component", "file-feed", "path", path),
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
}

// Kind returns KindFile.
func (f *Feed) Kind() string { return ingest.KindFile }

// Source returns the path of the file.
func (f *Feed) Source() string { return f.path }

// Open positions the feed after the checkpoint of partition 0, or at the start
// of the file at the path for a new feed (from[0] missing or with no epoch),
// which then yields a RecordEpoch at position 0 first. It does not wait for
// the file to exist. It returns an error when the file or its directory cannot
// be read, or when the feed was already opened.
func (f *Feed) Open(ctx context.Context, from map[int32]outbox.Checkpoint) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opened || f.closed {
		return fmt.Errorf("open file feed %s: already opened", f.path)
	}
	f.opened = true
	f.startWatch()
	cp, ok := from[0]
	var err error
	if ok && cp.Epoch != "" {
		err = f.resume(cp)
	} else {
		err = f.openPath()
	}
	if err != nil {
		return fmt.Errorf("open file feed: %w", err)
	}
	f.publishEnd()
	return nil
}

// Poll appends up to max (at least 1) ready records to buf. It returns as soon
// as one is ready, with as many as are, and otherwise waits for the file to
// change; it returns ctx.Err() when ctx is done first. Records already
// appended when an error occurs are returned without it, and the error on the
// next call.
func (f *Feed) Poll(ctx context.Context, buf []ingest.Record, maxRecords int) ([]ingest.Record, error) {
	start, limit := len(buf), len(buf)+max(maxRecords, 1)
	for {
		var err error
		buf, err = f.fill(buf, limit)
		if err != nil || len(buf) > start {
			return buf, err
		}
		if err := f.wait(ctx); err != nil {
			return buf, err
		}
	}
}

// fill appends ready records to buf up to limit, without waiting.
func (f *Feed) fill(buf []ingest.Record, limit int) ([]ingest.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.publishEnd()
	if err := f.usable(); err != nil {
		return buf, err
	}
	start := len(buf)
	for len(buf) < limit {
		if len(f.pending) > 0 {
			buf = append(buf, f.pending[0])
			f.pending = f.pending[1:]
			continue
		}
		rec, ok, err := f.step()
		if err == nil && ok {
			buf = append(buf, rec)
			continue
		}
		if err == nil && len(f.pending) > 0 {
			continue
		}
		if err != nil && len(buf) > start {
			f.failed = err
			err = nil
		}
		return buf, err
	}
	return buf, nil
}

// usable returns why the feed cannot be polled now, if it cannot.
func (f *Feed) usable() error {
	switch {
	case f.closed:
		return fmt.Errorf("poll %s: %w", f.path, fs.ErrClosed)
	case !f.opened:
		return fmt.Errorf("poll %s: feed not opened", f.path)
	case f.failed != nil:
		err := f.failed
		f.failed = nil
		return err
	}
	return nil
}

// fileMoves bounds how often step moves the feed on without a line: opening,
// announcing and switching files take fewer, and a file whose size promises
// bytes that reads do not give must not make Poll spin.
const fileMoves = 8

// step returns the next line of the current file as a record. When none is
// ready, or the last read found the end of the file, it moves the feed on
// (see advance) and tries again while that changed anything; ok is false when
// nothing is ready.
func (f *Feed) step() (ingest.Record, bool, error) {
	for range fileMoves {
		if f.cur != nil && f.cur.epoch != "" && !f.cur.atEOF {
			l, ok, err := f.cur.next()
			if err != nil || ok {
				return f.record(l), ok, err
			}
		}
		moved, err := f.advance()
		if err != nil || !moved || len(f.pending) > 0 {
			return ingest.Record{}, false, err
		}
	}
	return ingest.Record{}, false, nil
}

// record makes the item record of a line of the current file.
func (f *Feed) record(l fileLine) ingest.Record {
	r := ingest.Record{Kind: ingest.RecordItem, Epoch: f.cur.epoch, Position: l.end, Item: ingest.Item{Value: l.value}}
	if l.tooLong {
		r.BadReason = ingest.ReasonTooLong
		r.BadErr = fmt.Errorf("line ending at offset %d of %s is %d bytes long, over the %d-byte limit",
			l.end, f.path, l.size, f.opts.MaxLine)
	}
	return r
}

// Commit does nothing and returns nil: the store's position is the
// authority on what a file feed has delivered.
func (f *Feed) Commit(context.Context, []outbox.Checkpoint) error { return nil }

// Ends returns the size of the file read, as last seen, for partition 0
// (0 before there is a file). It is safe for concurrent use.
func (f *Feed) Ends() map[int32]int64 { return map[int32]int64{0: f.end.Load()} }

// MaxItemBytes is the longest line the feed delivers (see ItemSizer).
func (f *Feed) MaxItemBytes() int { return f.opts.MaxLine }

func (f *Feed) publishEnd() {
	if f.cur != nil {
		f.end.Store(f.cur.size)
	}
}

// Close closes the files and the watcher, and wakes a waiting Poll, which
// then returns an error wrapping fs.ErrClosed. Closing twice returns nil.
func (f *Feed) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	close(f.done)
	errs := []error{f.closeSource(f.cur), f.closeSource(f.next)}
	f.cur, f.next = nil, nil
	if f.watcher != nil {
		errs = append(errs, f.watcher.Close())
	}
	f.mu.Unlock()
	f.wg.Wait()
	return errors.Join(errs...)
}

func (f *Feed) closeSource(s *fileSource) error {
	if s == nil {
		return nil
	}
	return s.close()
}

// openPath makes the file at the path, if any, the current file, read from 0
// under an epoch not yet announced.
func (f *Feed) openPath() error {
	s, err := openFileSource(f.path, f.opts.MaxLine)
	if err != nil || s == nil {
		return err
	}
	f.use(s)
	return nil
}

// use makes s the current file and watches it.
func (f *Feed) use(s *fileSource) {
	f.cur = s
	f.found.Store(true)
	f.watchFile(s.file.Name())
}

// announce gives s, whose fingerprint is known, the epoch that follows the
// previous one, and queues its RecordEpoch.
func (f *Feed) announce(s *fileSource) {
	s.epoch = nextFileEpoch(s.id, f.prev)
	f.prev = s.epoch
	pos := s.split.pos
	f.pending = append(f.pending, ingest.Record{Kind: ingest.RecordEpoch, Epoch: s.epoch, Position: pos})
	f.log.Info("file feed epoch", logEpoch, s.epoch, logFrom, pos)
}

// lose queues a RecordLoss.
func (f *Feed) lose(epoch string, from, to int64, reason string) {
	f.pending = append(f.pending, ingest.Record{Kind: ingest.RecordLoss, Epoch: epoch, From: from, To: to, Reason: reason})
	f.log.Warn("file feed lost input", logEpoch, epoch, logFrom, from, logTo, to, "reason", reason)
}

// statPath returns os.Stat of path, with a missing file as a nil FileInfo.
func statPath(path string) (os.FileInfo, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	return fi, nil
}
