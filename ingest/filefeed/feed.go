// Package filefeed is the tailed-file feed: an ingest.Feed over a file of
// "\n"-terminated lines, followed through appends, truncation and rotation
// (see Feed), with the file's identity as its epoch. It owns fsnotify.
package filefeed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
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
	// LossTruncated: the file started over in place (truncated, or its inode
	// taken by a new file) with bytes past the position that no copy holds.
	// To is ingest.UnknownPosition: nothing tells how far the file had grown
	// before it was truncated.
	LossTruncated = "truncated before read"
	// LossReplaced: opened from a checkpoint, the checkpoint's file is neither
	// at the path nor beside it, and the checkpoint had seen bytes past the
	// position (From..To: the position to the size the checkpoint saw).
	LossReplaced = "file replaced while stopped; previous file not found"
	// LossUnterminated: a rotated file ended with bytes after its last "\n",
	// a line that never completed.
	LossUnterminated = "rotated away with an unterminated last line"
	// LossCompressed: a generation that was not read to its end was
	// compressed, and compressed generations are not read. From is where
	// reading stood in it (0 for a generation never read), To is
	// ingest.UnknownPosition.
	LossCompressed = "rotated generation compressed before it was read"
	// LossUnseenTruncated: the file started over in place with no copy to
	// read its rest from, every byte the feed saw of it read, and nothing
	// that rules out bytes written to it after the feed's last look: the
	// file's write events since then are more than the truncation and the
	// bytes it holds now account for, or there is no such evidence (no
	// watch on the file, or the truncation happened while the server was
	// down). To is ingest.UnknownPosition.
	LossUnseenTruncated = "truncated while unwatched: bytes written after the last read cannot be ruled out"
	// LossVanished: opened from a checkpoint, the checkpoint's file is
	// nowhere (deleted or replaced while the server was down): the bytes
	// it held past the position, if any, are gone, and nothing tells how
	// many. To is ingest.UnknownPosition.
	LossVanished = "vanished while unwatched: bytes written after the last read cannot be ruled out"
	// LossCutByTruncation: a copy of a file that started over in place
	// (copytruncate) ends with bytes after its last "\n": the file was
	// truncated in the middle of a line, before the line was complete and
	// read. From..To is exact: the position to the copy's end.
	LossCutByTruncation = "truncated before read: the copy ends in the middle of a line"
)

// Log keys of the file feed.
const (
	logEpoch = "epoch"
	logFrom  = "from"
	logTo    = "to"
	logErr   = "err"
	logFile  = "file"
)

// minLookGap is the least time without a look at the file after which a
// truncation found is taken to have hidden writes (see Feed).
const minLookGap = time.Second

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
	// AssumeNoUnseenWrites takes a file as written only while the feed
	// looked at it: a file truncated with no copy, or gone while the server
	// was down, after every byte seen of it was read, records no loss (a
	// warning says so), and a file gone while down loses only the bytes
	// seen past the position (LossReplaced). Off by default: such bytes
	// cannot be ruled out, and are then recorded as a loss of unknown
	// extent (LossUnseenTruncated, LossVanished).
	AssumeNoUnseenWrites bool
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
// Rotation. When the file read is no longer the one at the path, the feed
// reads it to its end, then each generation that followed it (the files a
// rotation scheme left beside the path: see generationSuffix for their names,
// generation.before for their order), oldest first, each to its end in its
// own epoch, and then the file at the path. So several rotations between two
// looks, or while the feed was stopped, lose nothing, and a generation read
// once is never read again. The chain is built only from a listing that two
// listings in a row agree on: one taken while a rotation renames files may
// miss a file, and the feed rather waits for the next look. The file read is
// read to its end again once the one that follows it is found: its writer's
// last bytes may come between the feed's look and the move. Compressed
// generations are not read: one that follows the file read is a RecordLoss
// (LossCompressed).
//
// Truncation. A file that starts over in place (shorter than what was read
// of it, another first line, or other bytes before the read position than
// the last line read: looked at whenever reading reaches the end, and the
// first line after every read) gets a new epoch, read from 0. Its rest is looked for
// first in a copy beside it, as logrotate's copytruncate leaves one (see
// findCopy), and read from there in the old epoch. Without a copy, the feed
// yields a RecordLoss from the position, of unknown extent: LossTruncated
// when bytes past it had been seen, or when the file, empty now, had more
// write events since the feed's last look than the truncation's own (the
// watcher takes them even while the feed is not polled, as the kernel
// queues them for a stopped process); LossUnseenTruncated when nothing
// rules out bytes written after the last look: more events than the
// truncation and one write since, with bytes in the file that more writes
// may explain, or no such evidence (the file not watched both by itself
// and by its directory, or renamed away), or a truncation while the feed
// was not running. Events that the truncation and the file's bytes account
// for exactly (one event of each watch for the truncation, one more for a
// write since when the file holds bytes) rule unread bytes out: no loss.
// With Options.AssumeNoUnseenWrites a truncation after every byte seen
// was read is no loss.
// The next file (opened at the path while older generations are read) that
// started over in place before the feed got to it has what it held when
// opened read from its copy first, in the copy's identity; without one,
// that is a RecordLoss (LossTruncated) from 0, of unknown extent. A copy
// read to its end before the feed moves to the file settles what it held:
// deleted, compressed or renamed away after that, it took nothing unread,
// and no loss is recorded. The
// generations are listed again after the look that shows it started over,
// so the copies of lives it had since (copytruncate run again and again)
// are read first too; left empty, it is moved to only once it has a first
// line again.
//
// Opened from a checkpoint, the feed finds the checkpoint's file again by
// its inode, at the path or among the generations, and goes on after the
// position (or, truncated, as above). When that file is gone, what it held
// past the position is lost (LossVanished, of unknown extent: bytes may
// have been written to it after the checkpoint's last look; with
// Options.AssumeNoUnseenWrites, LossReplaced for the bytes the checkpoint
// saw past the position, and none seen: no loss, and a warning), and the
// generations modified after the checkpoint was stored, then the file at
// the path, are read. The checkpoint's
// UpdatedAt is compared with the files' times, so it must be the wall-clock
// time it was stored at (as outbox.Tx.SetPosition stores it).
//
// What no look can tell goes unnoticed: a file truncated and written again
// past the read position with the same first line and the same last line
// before the position; a generation created and deleted between two looks.
// (Bytes written to a file after the feed's last look at it, when no copy or
// generation keeps them, are recorded lost unless the evidence rules them
// out, as above.)
//
// While the path does not exist or cannot be opened, and nothing else is
// left to read, the feed waits for it (see Waiting).
//
// Open, Poll, Commit and Close are called from one goroutine, except that
// Close may be called while Poll waits, or while Open waits to resume again
// (see Open), to end it. Ends and Waiting may be
// called from any goroutine.
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
	// held are files once at the path (opened as next) that a rotation moved
	// on before the feed got to them: kept open, so that a generation seen is
	// read even when it is deleted before its turn.
	held []*fileSource
	// floor, with no current file, is where in the chain of generations to
	// start: after the checkpoint's file, gone when the feed was opened.
	floor *chainMark
	// lostGens are the compressed generations already reported lost.
	lostGens map[fileID]bool
	// passed are the files read to their end in this run and still listed
	// among the generations: never read again.
	passed map[fileID]bool
	// readLives are the files read from 0 to their end in this run, in
	// their own epoch, the newest last (at most maxReadLives): a copy of
	// the next file's first life read so is that life settled, even once
	// the copy is gone from beside the path (see lifeRead).
	readLives []readLife

	// listOnce takes one listing of the path's directory: tests list in
	// the middle of a rotation through it.
	listOnce func(path string) ([]generation, error)
	// looking, when set, is called when the feed looks at the next file to
	// decide what it holds (before it is switched to, or matched against a
	// copy), or at the current file before its first line: just before the
	// look (fingerprinted false) and just after its fingerprint is read
	// (true). Tests rotate there, in the middle of the feed's steps. nil
	// outside tests.
	looking func(s *fileSource, fingerprinted bool)
	// settling, when set, is called as the feed starts to wait for the
	// write events of a truncation (see settle). Tests write there. nil
	// outside tests.
	settling func()

	clock   func() time.Time // the feed's clock, for how long it did not look
	lookGap time.Duration    // longer without a look: writes may have been missed
	waiting atomic.Pointer[string]

	end atomic.Int64
	// mods counts the write events of the file the feed reads (under the
	// name modName it watches it by), as the watcher takes them: each look
	// notes it (fileSource.mods), so that a truncation found later tells
	// how often the file was modified since (see writesSince).
	mods       atomic.Int64
	modName    atomic.Pointer[string]
	watcher    *fsnotify.Watcher
	dirWatched bool
	wake       chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup
}

var _ ingest.Feed = (*Feed)(nil)

// New returns a feed on the file at path. The file need not exist
// yet. Nothing is opened before Open.
func New(path string, opts Options) *Feed {
	opts = opts.withDefaults()
	return &Feed{
		path:     path,
		opts:     opts,
		log:      opts.Logger.With("component", "file-feed", "path", path),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		lostGens: map[fileID]bool{},
		passed:   map[fileID]bool{},
		listOnce: listGenerationsOnce,
		clock:    time.Now,
		lookGap:  max(4*opts.PollInterval, minLookGap),
	}
}

// Kind returns KindFile.
func (f *Feed) Kind() string { return ingest.KindFile }

// Source returns the path of the file.
func (f *Feed) Source() string { return f.path }

// Open positions the feed after the checkpoint of partition 0, or at the start
// of the file at the path for a new feed (from[0] missing or with no epoch),
// which then yields a RecordEpoch at position 0 first. It does not wait for
// the file to exist: a missing or unreadable file is waited for (see
// Waiting). Resuming from a checkpoint lists the path's directory; while a
// burst of renames keeps the listings from agreeing, Open tries again with a
// capped backoff, logging each try, for as long as ctx lives and the feed
// is not closed (see resumeSettled). It returns an error when the directory
// cannot be listed or read, when ctx ends first (wrapping ctx.Err()), or
// when the feed was already opened.
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
	if !ok || cp.Epoch == "" {
		_, err := f.begin()
		if err != nil {
			return fmt.Errorf("open file feed: %w", err)
		}
		f.publishEnd()
		return nil
	}
	f.mu.Unlock()
	err := f.resumeSettled(ctx, cp)
	f.mu.Lock()
	if err != nil {
		return fmt.Errorf("open file feed: %w", err)
	}
	f.publishEnd()
	return nil
}

// Bounds of the waits between resumes that found the generations being
// renamed (see resumeSettled).
const (
	resumeFirstWait = 10 * time.Millisecond
	resumeMaxWait   = time.Second
)

// resumeSettled resumes from cp, and again, after a capped backoff, while
// resuming fails because a burst of renames kept the generations from
// settling within a listing's bound (errUnsettled): the chain taken from an
// unsettled listing may miss a generation, and a failed start would stop
// the feed for good. Each try that fails is undone (see resumeOnce) and
// logged. Other errors end it; so do ctx's end and Close. f.mu must not be
// held: it is taken for each try, not across the waits.
func (f *Feed) resumeSettled(ctx context.Context, cp outbox.Checkpoint) error {
	wait := &backoff.ExponentialBackOff{
		InitialInterval:     resumeFirstWait,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         resumeMaxWait,
	}
	for try := 1; ; try++ {
		err := f.resumeOnce(cp)
		if !errors.Is(err, errUnsettled) {
			return err
		}
		d := wait.NextBackOff()
		f.log.Warn("the generations kept changing while the feed resumed; resuming again",
			"try", try, "wait", d, logErr, err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("resume %s: %w", f.path, errors.Join(ctx.Err(), err))
		case <-f.done:
			t.Stop()
			return fmt.Errorf("resume %s: %w", f.path, fs.ErrClosed)
		case <-t.C:
		}
	}
}

// resumeOnce takes f.mu and resumes from cp once. When resuming fails, the
// feed is put back as it was before: the files it opened are closed, and
// what it queued or noted is dropped, so that it can be resumed again.
func (f *Feed) resumeOnce(cp outbox.Checkpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("resume %s: %w", f.path, fs.ErrClosed)
	}
	before := f.saveState()
	err := f.resume(cp)
	if err != nil {
		err = errors.Join(err, f.restoreState(before))
	}
	return err
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
	for _, h := range f.held {
		errs = append(errs, f.closeSource(h))
	}
	f.cur, f.next, f.held = nil, nil, nil
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

// use makes s the current file and watches it.
func (f *Feed) use(s *fileSource) {
	f.cur = s
	s.lookedAt = f.clock()
	s.watches = f.watchFile(s.file.Name())
	s.mods = f.mods.Load()
}

// announce gives s, whose fingerprint is known, the epoch that follows the
// previous one (or, for a file that started over in place after the rest of
// its epoch was read from a copy, the one that follows that epoch), and
// queues its RecordEpoch.
func (f *Feed) announce(s *fileSource) {
	s.epoch = nextFileEpoch(s.id, cmp.Or(s.restartOf, f.prev))
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
