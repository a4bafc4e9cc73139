package recording

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Options configure a Recorder.
type Options struct {
	// Dir receives the recording files (created if missing).
	Dir string
	// Header describes the feed, its processor and its loop; the recorder
	// sets Run, Part, StartedAt, From and Snapshot.
	Header Header
	// Store is the feed's database, copied as the run's snapshot when
	// Snapshot is set.
	Store    *outbox.Store
	Snapshot bool
	// MaxBytes is the size past which a recording file is closed and the
	// next part started, after the transaction that crossed it: a
	// transaction is never split.
	MaxBytes int64
	// Logger defaults to slog.Default(); Now to time.Now.
	Logger *slog.Logger
	Now    func() time.Time
}

// MinMaxBytes is the smallest Options.MaxBytes.
const MinMaxBytes = 64 << 10

// DefaultMaxBytes is the default Options.MaxBytes: 1 GiB.
const DefaultMaxBytes = 1 << 30

// Status is what a recorder reports.
type Status struct {
	// Recording is true while it writes; false before the run starts,
	// after it ended, or once it failed (Error says why).
	Recording bool   `json:"recording"`
	File      string `json:"file"`
	// Bytes counts what it wrote in this run, every part included; Files
	// counts the parts.
	Bytes int64  `json:"bytes"`
	Files int    `json:"files"`
	Error string `json:"error,omitempty"`
}

// Recorder writes the recording of one feed's run: an ingest.Recorder.
// Its methods are called by one loop (see ingest.Recorder); Status is safe
// for concurrent use. A failure to write (a full disk) stops the
// recording, never the loop: the file ends with the last transaction
// written whole, the error is logged and in Status.
type Recorder struct {
	o   Options
	log *slog.Logger

	w        *Writer
	hdr      Header // the current file's
	last     map[int32]outbox.Checkpoint
	prepared bool
	active   bool

	mu     sync.Mutex
	status Status
	bytes  int64 // written by the closed parts
}

var _ ingest.Recorder = (*Recorder)(nil)

// NewRecorder checks o and returns a recorder; nothing is written until
// the loop starts it.
func NewRecorder(o Options) (*Recorder, error) {
	switch {
	case o.Dir == "":
		return nil, errors.New("record: no directory")
	case o.Header.Feed == "":
		return nil, errors.New("record: no feed")
	case o.MaxBytes < MinMaxBytes:
		return nil, fmt.Errorf("record: max bytes %d, want at least %d", o.MaxBytes, MinMaxBytes)
	case o.Snapshot && o.Store == nil:
		return nil, errors.New("record: a snapshot needs the store")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Recorder{o: o, log: o.Logger.With("component", "recording", "feed", o.Header.Feed)}, nil
}

// Status returns what the recorder is doing.
func (r *Recorder) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// runName names a run by its start, UTC, so names sort by time.
func runName(t time.Time) string { return t.UTC().Format("20060102T150405.000000000Z") }

// Start takes the snapshot (when asked) and creates the run's first file.
func (r *Recorder) Start(ctx context.Context, from map[int32]outbox.Checkpoint) {
	if err := os.MkdirAll(r.o.Dir, 0o755); err != nil {
		r.fail(fmt.Errorf("create %s: %w", r.o.Dir, err))
		return
	}
	h := r.o.Header
	h.StartedAt = r.o.Now().UTC()
	h.Run, h.Part, h.From = runName(h.StartedAt), 1, checkpointsOf(from)
	if r.o.Snapshot {
		h.Snapshot = fmt.Sprintf("%s-%s.snapshot.db", h.Feed, h.Run)
		began := time.Now()
		note := fmt.Sprintf("snapshot of feed %s as of run %s", h.Feed, h.Run)
		if err := r.o.Store.Snapshot(ctx, filepath.Join(r.o.Dir, h.Snapshot), note); err != nil {
			r.fail(err)
			return
		}
		r.log.Info("recording: database snapshot taken", "file", h.Snapshot, "took", time.Since(began))
	}
	r.last = maps.Clone(from)
	r.open(h)
}

// partName is the file name of part part of the run h records.
func partName(h Header, part int) string {
	return fmt.Sprintf("%s-%s-%04d.rec", h.Feed, h.Run, part)
}

// open creates the file of part h.Part and records into it.
func (r *Recorder) open(h Header) {
	w, err := Create(filepath.Join(r.o.Dir, partName(h, h.Part)), h)
	if err != nil {
		r.fail(err)
		return
	}
	r.use(w, h)
}

// use makes w, the file of part h.Part, the one recorded into.
func (r *Recorder) use(w *Writer, h Header) {
	r.w, r.hdr, r.active = w, h, true
	r.mu.Lock()
	r.status.Recording, r.status.File, r.status.Files = true, w.Path(), h.Part
	r.status.Bytes = r.bytes + w.Size()
	r.mu.Unlock()
	r.log.Info("recording", "file", w.Path(), "part", h.Part)
}

// fail stops the recording for err.
func (r *Recorder) fail(err error) {
	r.log.Error("recording stopped: the feed goes on unrecorded from here", "err", err)
	if r.w != nil {
		r.w.f.Close()
	}
	r.active, r.w = false, nil
	r.mu.Lock()
	r.status.Recording, r.status.Error = false, err.Error()
	r.mu.Unlock()
}

// Begin drops what an uncommitted transaction handed over.
func (r *Recorder) Begin() {
	if !r.active {
		return
	}
	r.w.Discard()
	r.prepared = false
}

// Handled encodes an item at once (the feed's buffers are not kept), its
// frame ended by its outcome, or adds an epoch change or a loss.
func (r *Recorder) Handled(rec ingest.Record, d ingest.Delivery) {
	if !r.active {
		return
	}
	if rec.Kind != ingest.RecordItem {
		r.w.Control(rec)
		return
	}
	if n := itemSize(rec.Item); n > MaxItemBytes {
		r.fail(fmt.Errorf("item at %s[%d] position %d holds %d bytes, over the %d a recording holds",
			d.Feed, d.Partition, d.Position, n, MaxItemBytes))
		return
	}
	r.w.BeginItem(rec, d)
}

// Outcome adds the item last handled, with o.
func (r *Recorder) Outcome(o ingest.Outcome) {
	if !r.active {
		return
	}
	r.w.EndItem(o)
}

// Prepare writes the transaction.
func (r *Recorder) Prepare(cps map[int32]outbox.Checkpoint) {
	if !r.active {
		return
	}
	if err := r.w.Prepare(cps); err != nil {
		r.fail(err)
		return
	}
	r.prepared = true
	r.last = maps.Clone(cps)
}

// Committed writes the commit frame, and starts the next part when the
// file has grown past MaxBytes.
func (r *Recorder) Committed() {
	if !r.active || !r.prepared {
		return
	}
	r.prepared = false
	if err := r.w.Commit(); err != nil {
		r.fail(err)
		return
	}
	size := r.w.Size()
	r.mu.Lock()
	r.status.Bytes = r.bytes + size
	r.mu.Unlock()
	if size >= r.o.MaxBytes {
		r.rotate()
	}
}

// rotate creates the next part, starting from the checkpoints just
// committed, then ends the file by naming it and closes it. The next part
// is on disk first: a part that names its successor had it beside it, so
// a successor missing was removed; a crash between the two leaves a part
// that ends after its last commit without naming the next, which a
// reader takes as such.
func (r *Recorder) rotate() {
	old := r.w
	r.w = nil
	h := r.hdr
	h.Part++
	h.From, h.Snapshot = checkpointsOf(r.last), ""
	w, err := Create(filepath.Join(r.o.Dir, partName(h, h.Part)), h)
	if err != nil {
		old.f.Close()
		r.fail(err)
		return
	}
	if err := errors.Join(old.Next(h.Part, partName(h, h.Part)), old.Close()); err != nil {
		w.f.Close()
		r.fail(err)
		return
	}
	r.bytes += old.Size()
	r.use(w, h)
}

// Close ends the run's recording with its end frame, then syncs and
// closes the file.
func (r *Recorder) Close() {
	if !r.active {
		return
	}
	w := r.w
	r.active, r.w = false, nil
	if err := errors.Join(w.End(r.hdr.Part), w.Close()); err != nil {
		r.fail(err)
		return
	}
	r.mu.Lock()
	r.status.Recording, r.status.Bytes = false, r.bytes+w.Size()
	r.mu.Unlock()
	r.log.Info("recording closed", "file", w.Path(), "bytes", w.Size())
}
