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
	// Retention bounds the feed's recordings in Dir by age and bytes; at
	// its MaxTotalBytes the recorder pauses (never the feed) until
	// retention frees room.
	Retention Retention
	// SnapshotInterval, when not 0, lets a run record from the feed's
	// last snapshot when it is younger than this, rather than take one
	// (a replay starts from that snapshot's run).
	SnapshotInterval time.Duration
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
	// after it ended, while it is paused, or once it failed (Error says
	// why).
	Recording bool   `json:"recording"`
	File      string `json:"file"`
	// Bytes counts what it wrote since the process started, every part
	// included; Files counts the parts.
	Bytes int64  `json:"bytes"`
	Files int    `json:"files"`
	Error string `json:"error,omitempty"`
	// DiskBytes is what the feed's recordings (parts, snapshots) hold in
	// the directory, as last counted: at each commit while recording, at
	// each retention pass otherwise.
	DiskBytes int64 `json:"diskBytes"`
	// Paused says the recording stopped at the retention's total cap
	// (Retention.MaxTotalBytes) and why; the feed goes on unrecorded
	// until retention frees room, then a new run starts with a snapshot.
	Paused string `json:"paused,omitempty"`
	// RemovedFiles and RemovedBytes count what retention removed since
	// the process started.
	RemovedFiles int   `json:"removedFiles"`
	RemovedBytes int64 `json:"removedBytes"`
}

// retainEvery is how often retention runs while a recorder records or
// is paused (and at each start and new part).
const retainEvery = time.Minute

// Recorder writes the recording of one feed's run: an ingest.Recorder.
// Its methods are called by one loop (see ingest.Recorder); Status is safe
// for concurrent use. A failure to write (a full disk) stops the
// recording, never the loop: the file ends with the last transaction
// written whole, the error is logged and in Status.
type Recorder struct {
	o   Options
	log *slog.Logger

	ctx      context.Context // the loop's, from Start
	w        *Writer
	hdr      Header // the current file's
	last     map[int32]outbox.Checkpoint
	prepared bool
	active   bool

	// pending are the checkpoints of the transaction prepared, committed
	// those of the last one committed: kept while paused, for the run
	// that resumes.
	pending, committed map[int32]outbox.Checkpoint
	paused             bool
	retained           time.Time // the last retention pass
	others             int64     // the feed's bytes on disk but the current part's

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
	case o.Retention.MaxAge < 0 || o.Retention.MaxTotalBytes < 0 || o.SnapshotInterval < 0:
		return nil, errors.New("record: a negative retention or snapshot interval")
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

// Start removes what snapshots killed while being taken left, applies
// the retention, takes the snapshot (when asked; or reuses the last one,
// see Options.SnapshotInterval) and creates the run's first file. Over
// the total cap, it starts paused.
func (r *Recorder) Start(ctx context.Context, from map[int32]outbox.Checkpoint) {
	r.ctx = ctx
	if err := os.MkdirAll(r.o.Dir, 0o755); err != nil {
		r.fail(fmt.Errorf("create %s: %w", r.o.Dir, err))
		return
	}
	files, bytes, err := removeLeftovers(r.o.Dir, r.o.Header.Feed)
	if err != nil {
		r.fail(err)
		return
	}
	if files > 0 {
		r.log.Info("recording: removed what unfinished snapshots left", "files", files, "bytes", bytes)
	}
	r.committed = maps.Clone(from)
	reuse, reuseRun := "", ""
	if r.o.Snapshot {
		var err error
		if reuse, reuseRun, err = reusableSnapshot(r.o.Dir, r.o.Header.Feed, r.o.SnapshotInterval, r.o.Now().UTC()); err != nil {
			r.fail(err)
			return
		}
	}
	if reuse != "" {
		// The generation recorded from stays; with no room beside it, a
		// new one starts.
		if !r.retain(reuseRun, false, 0) {
			return
		}
		if r.overCap(0) {
			reuse = ""
		}
	}
	var room int64 // a new snapshot's bytes, made room for first
	if reuse == "" {
		var ok bool
		if room, ok = r.snapshotRoom(); !ok || !r.retain("", true, room) {
			return
		}
	}
	if r.overCap(room) {
		r.pause(room)
		return
	}
	r.startRun(reuse != "")
}

// startRun starts a run from the last committed checkpoints: with a
// snapshot (reused when reuse allows it and one is young enough).
func (r *Recorder) startRun(reuse bool) {
	h := r.o.Header
	h.StartedAt = r.o.Now().UTC()
	h.Run, h.Part, h.From = runName(h.StartedAt), 1, checkpointsOf(r.committed)
	if r.o.Snapshot {
		name, run := "", ""
		if reuse {
			var err error
			if name, run, err = reusableSnapshot(r.o.Dir, h.Feed, r.o.SnapshotInterval, h.StartedAt); err != nil {
				r.fail(err)
				return
			}
		}
		if name != "" {
			h.Snapshot, h.SnapshotRun = name, run
			r.log.Info("recording: the feed's last snapshot is reused", "file", name, "run", run)
		} else {
			h.Snapshot = fmt.Sprintf("%s-%s.snapshot.db", h.Feed, h.Run)
			began := time.Now()
			note := fmt.Sprintf("snapshot of feed %s as of run %s", h.Feed, h.Run)
			if err := r.o.Store.Snapshot(r.ctx, filepath.Join(r.o.Dir, h.Snapshot), note); err != nil {
				if r.ctx.Err() != nil {
					// The loop is stopping: no run to record, nothing failed.
					r.log.Info("recording: the loop stopped before the run's snapshot was taken")
					return
				}
				r.fail(err)
				return
			}
			r.log.Info("recording: database snapshot taken", "file", h.Snapshot, "took", time.Since(began))
		}
	}
	r.last = maps.Clone(r.committed)
	r.open(h)
	if r.active {
		r.count()
	}
}

// count takes the feed's bytes on disk but the current part's.
func (r *Recorder) count() {
	files, err := feedFiles(r.o.Dir, r.o.Header.Feed)
	if err != nil {
		return
	}
	var n int64
	for _, f := range files {
		if r.w == nil || f.name != filepath.Base(r.w.Path()) {
			n += f.size
		}
	}
	r.others = n
	r.setDisk()
}

// setDisk reports the bytes on disk.
func (r *Recorder) setDisk() {
	n := r.others
	if r.w != nil {
		n += r.w.Size()
	}
	r.mu.Lock()
	r.status.DiskBytes = n
	r.mu.Unlock()
}

// overCap reports whether the feed's recordings, with room bytes more,
// hold the total cap.
func (r *Recorder) overCap(room int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.o.Retention.MaxTotalBytes > 0 && r.status.DiskBytes+room >= r.o.Retention.MaxTotalBytes
}

// snapshotRoom is what a new run's snapshot will take on disk (0 without
// snapshots or without a total cap); false when it could not be told
// (the recording stopped).
func (r *Recorder) snapshotRoom() (int64, bool) {
	if !r.o.Snapshot || r.o.Retention.MaxTotalBytes == 0 {
		return 0, true
	}
	n, err := r.o.Store.SnapshotBytes(r.ctx)
	if err != nil {
		if r.ctx.Err() != nil {
			return 0, false // the loop is stopping: no run to record
		}
		r.fail(err)
		return 0, false
	}
	return n, true
}

// retain runs the retention, keeping run keep's generation (and the
// newest) and leaving room bytes free under the cap; false when it
// failed (the recording stopped).
func (r *Recorder) retain(keep string, newestToo bool, room int64) bool {
	r.retained = r.o.Now()
	if r.o.Retention == (Retention{}) {
		r.count()
		return true
	}
	left, files, bytes, err := retain(r.o.Dir, r.o.Header.Feed, keep, newestToo, room, r.o.Retention, r.retained)
	if err != nil {
		r.fail(err)
		return false
	}
	if files > 0 {
		r.log.Info("recording: retention removed old recordings", "files", files, "bytes", bytes)
	}
	r.mu.Lock()
	r.status.RemovedFiles += files
	r.status.RemovedBytes += bytes
	r.mu.Unlock()
	r.others = left
	if r.w != nil {
		r.others -= r.w.Size()
	}
	r.setDisk()
	return true
}

// pause stops recording at the total cap: the run ends (its end frame,
// and a gap mark so that no later run records from its snapshot), the
// feed goes on.
func (r *Recorder) pause(room int64) {
	why := fmt.Sprintf("the feed's recordings hold %d bytes, the cap is %d (--record-max-total-bytes): "+
		"paused until retention frees room", r.Status().DiskBytes, r.o.Retention.MaxTotalBytes)
	if room > 0 {
		why = fmt.Sprintf("the feed's recordings hold %d bytes and a new run's snapshot needs %d, the cap is %d "+
			"(--record-max-total-bytes): paused until retention frees room", r.Status().DiskBytes, room, r.o.Retention.MaxTotalBytes)
	}
	run := r.hdr.Run
	if r.active {
		w := r.w
		r.active, r.w = false, nil
		if err := errors.Join(w.End(r.hdr.Part), w.Close()); err != nil {
			r.fail(err)
			return
		}
		r.bytes += w.Size()
	}
	if run != "" {
		gap := filepath.Join(r.o.Dir, fmt.Sprintf("%s-%s.gap", r.o.Header.Feed, run))
		if f, err := os.OpenFile(gap, os.O_WRONLY|os.O_CREATE, 0o644); err == nil {
			f.Close()
		}
	}
	r.paused = true
	r.count()
	r.mu.Lock()
	r.status.Recording, r.status.Paused, r.status.File = false, why, ""
	r.mu.Unlock()
	r.log.Warn("recording paused: the feed goes on unrecorded", "why", why)
}

// resumeIfRoom starts a new run, with a new snapshot, once retention
// has brought the recordings under the cap.
func (r *Recorder) resumeIfRoom() {
	if r.o.Now().Sub(r.retained) < retainEvery {
		return
	}
	room, ok := r.snapshotRoom()
	if !ok || !r.retain("", false, room) || r.overCap(room) {
		return
	}
	r.paused = false
	r.mu.Lock()
	r.status.Paused = ""
	r.mu.Unlock()
	r.log.Info("recording resumed: a new run starts with a snapshot")
	r.startRun(false)
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
	if r.hdr.Run != "" {
		// No later run may record from this run's snapshot: the recordings
		// stop here. An empty file: made on a full disk too, most often.
		if f, err := os.OpenFile(filepath.Join(r.o.Dir, fmt.Sprintf("%s-%s.gap", r.o.Header.Feed, r.hdr.Run)), os.O_WRONLY|os.O_CREATE, 0o644); err == nil {
			f.Close()
		}
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
	r.pending = cps
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
//
// At the retention's total cap it pauses; paused, it resumes once
// retention freed room.
func (r *Recorder) Committed() {
	if r.pending != nil {
		r.committed, r.pending = maps.Clone(r.pending), nil
	}
	if r.paused {
		r.resumeIfRoom()
		return
	}
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
	r.setDisk()
	if r.o.Retention != (Retention{}) && (r.overCap(0) || r.o.Now().Sub(r.retained) >= retainEvery) {
		if !r.retain(r.hdr.Run, false, 0) {
			return
		}
		if r.overCap(0) {
			r.pause(0)
			return
		}
	}
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
	h.From, h.Snapshot, h.SnapshotRun = checkpointsOf(r.last), "", ""
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
	r.count()
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
	r.others += w.Size()
	r.setDisk()
	r.log.Info("recording closed", "file", w.Path(), "bytes", w.Size())
}
