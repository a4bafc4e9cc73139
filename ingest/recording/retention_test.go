package recording_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// onDisk lists dir's files (not directories) with their sizes.
func onDisk(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = fi.Size()
	}
	return m
}

func total(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func names(m map[string]int64, suffix string) []string {
	var out []string
	for n := range m {
		if strings.HasSuffix(n, suffix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// TestRecorder_SnapshotReuse: runs within the snapshot interval record
// from the first run's snapshot: one snapshot for three runs, and the
// three replay from it identical to the live database; the second alone
// is refused, naming the run to start from.
func TestRecorder_SnapshotReuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv"),
		snapshotInterval: time.Hour}
	var all string
	for range 3 {
		in := lines(rng, 1500)
		all += in
		appendFile(t, r.input, in)
		r.record(t)
	}
	files := onDisk(t, r.dir)
	snaps, parts := names(files, ".snapshot.db"), recordings(t, r.dir)
	if len(snaps) != 1 || len(parts) != 3 {
		t.Fatalf("files %v: want one snapshot and three recordings", files)
	}
	for i, p := range parts {
		h := header(t, p)
		if h.Snapshot != snaps[0] || (i == 0) != (h.SnapshotRun == "") || (i > 0 && !strings.Contains(snaps[0], h.SnapshotRun)) {
			t.Fatalf("run %d: snapshot %q of run %q, want %s", i+1, h.Snapshot, h.SnapshotRun, snaps[0])
		}
	}
	sum, res, err := replay(t, filepath.Join(dir, "out.db"), r.db, ledger.New("ledger.out"), r.dir)
	if err != nil {
		t.Fatal(err)
	}
	c := countOf(all)
	checkSummary(t, sum, c, 0)
	checkIdentical(t, res, c.lines)

	set, err := recording.Scan(parts[1:2])
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = recording.OpenTarget(t.Context(), set, filepath.Join(dir, "two.db"), "")
	if err == nil || !strings.Contains(err.Error(), "records from the snapshot "+snaps[0]+", taken at the start of run "+header(t, parts[1]).SnapshotRun) {
		t.Fatalf("replay of the second run alone: %v", err)
	}
}

func header(t *testing.T, path string) recording.Header {
	t.Helper()
	rd, err := recording.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	return rd.Header()
}

// TestRecorder_RetentionBytes: over the total cap, retention removes the
// oldest generations (a snapshot and its run) whole, never the one being
// written; the status counts the bytes on disk and removed to the byte,
// and what is left replays from its first snapshot identical to the live
// database.
func TestRecorder_RetentionBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv")}
	var ins []string
	var before map[string]int64
	var st recording.Status
	for i := range 4 {
		if i == 3 {
			before = onDisk(t, r.dir)
			r.retention = recording.Retention{MaxTotalBytes: total(before) / 2}
		}
		in := lines(rng, 1500)
		ins = append(ins, in)
		appendFile(t, r.input, in)
		st = r.record(t)
	}
	files := onDisk(t, r.dir)
	var removed int64
	gone := 0
	for n, sz := range before {
		if _, ok := files[n]; !ok {
			removed += sz
			gone++
		}
	}
	if st.DiskBytes != total(files) || st.Paused != "" || st.RemovedBytes != removed || st.RemovedFiles != gone || gone == 0 || gone%2 != 0 {
		t.Fatalf("status %+v; files %v hold %d bytes, %d files of %d bytes removed", st, files, total(files), gone, removed)
	}
	// Whole generations went, the oldest first: the runs left are the
	// newest, each with its snapshot.
	left := recordings(t, r.dir)
	snaps := names(files, ".snapshot.db")
	if len(snaps) != len(left) || len(left) < 1 || len(left) > 4 {
		t.Fatalf("files left %v", files)
	}
	var older int64 // what the generations but the newest hold
	for _, n := range left[:len(left)-1] {
		older += files[n] + files[strings.TrimSuffix(n, "-0001.rec")+".snapshot.db"]
	}
	if older > r.retention.MaxTotalBytes {
		t.Fatalf("the generations but the newest hold %d bytes, over the cap %d: %v", older, r.retention.MaxTotalBytes, files)
	}
	sum, res, err := replay(t, filepath.Join(dir, "out.db"), r.db, ledger.New("ledger.out"), r.dir)
	if err != nil {
		t.Fatal(err)
	}
	c := countOf(strings.Join(ins[4-len(left):], ""))
	if sum.Items != int64(c.lines) || sum.Applied != int64(c.valid) || sum.DeadLettered != int64(c.malformed) || sum.DecisionsDiffering != 0 {
		t.Fatalf("replay items %d applied %d dead %d, want %+v", sum.Items, sum.Applied, sum.DeadLettered, c)
	}
	if res.Deliveries != int64(c.lines) || res.Divergent != 0 || !res.Tables[0].Same() {
		t.Fatalf("diff %+v", res)
	}
}

// TestRecorder_PauseAndResume: at the total cap the recorder pauses (the
// feed goes on), the status says so and counts the bytes on disk to the
// byte; once age retention removed the paused recordings it resumes with
// a new snapshot, and the new run replays identical to the live database.
func TestRecorder_PauseAndResume(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	dir := t.TempDir()
	var skew atomic.Int64 // the recorder's clock, ahead of the files'
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv"), now: now}
	appendFile(t, r.input, lines(rng, 300))
	r.record(t) // a first run, to learn the snapshot's size
	first := onDisk(t, r.dir)
	snap := first[names(first, ".snapshot.db")[0]]
	// The first run is removed at the second's start (it starts a
	// generation of its own); the second pauses once it holds the cap.
	r.retention = recording.Retention{MaxAge: time.Hour, MaxTotalBytes: snap + 250_000}
	more := lines(rng, 4000)
	appendFile(t, r.input, more)
	var paused recording.Status
	var gone map[string]int64
	resumed := lines(rng, 300)
	second := 0
	r.during = func(rec *recording.Recorder) {
		waitFor(t, func() error {
			if paused = rec.Status(); paused.Paused == "" {
				return fmt.Errorf("status %+v, cap %d", paused, r.retention.MaxTotalBytes)
			}
			return nil
		})
		gone = onDisk(t, r.dir)
		// Two hours on: every file is past the age; the next commit after
		// a retention pass resumes.
		skew.Store(int64(2 * time.Hour))
		// The first half's commits resume the recording (with a snapshot);
		// the second half is recorded in the new run.
		half := strings.Index(resumed[len(resumed)/2:], "\n") + len(resumed)/2 + 1
		appendFile(t, r.input, resumed[:half])
		waitFor(t, func() error {
			if s := rec.Status(); !s.Recording || s.Paused != "" {
				return fmt.Errorf("not resumed: %+v", s)
			}
			return nil
		})
		appendFile(t, r.input, resumed[half:])
		second = countOf(resumed[half:]).lines
	}
	st := r.record(t)
	if paused.Recording || paused.DiskBytes != total(gone) || paused.DiskBytes < r.retention.MaxTotalBytes ||
		!strings.Contains(paused.Paused, "the cap is "+itoa(r.retention.MaxTotalBytes)) {
		t.Fatalf("paused status %+v; files %v hold %d bytes", paused, gone, total(gone))
	}
	if gaps := names(gone, ".gap"); len(gaps) != 1 || gone[gaps[0]] != 0 {
		t.Fatalf("files at the pause %v: want one empty gap mark", gone)
	}
	files := onDisk(t, r.dir)
	if st.Paused != "" || st.DiskBytes != total(files) || st.RemovedBytes != total(first)+total(gone) || st.RemovedFiles != len(first)+len(gone) {
		t.Fatalf("status %+v: files %v hold %d bytes, %d removed", st, files, total(files), total(gone))
	}
	if len(names(files, ".snapshot.db")) != 1 || len(recordings(t, r.dir)) != 1 || len(names(files, ".gap")) != 0 {
		t.Fatalf("files after the resume %v: want a new snapshot and its run", files)
	}
	sum, res, err := replay(t, filepath.Join(dir, "out.db"), r.db, ledger.New("ledger.out"), r.dir)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Items < int64(second) || sum.Items > int64(countOf(resumed).lines) || !res.Identical || res.Divergent != 0 {
		t.Fatalf("replay of the resumed run: %+v, diff %+v", sum, res)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestRecorder_StoppedBeforeSnapshot: a loop that stops while its
// recorder takes the run's snapshot leaves no error and no run.
func TestRecorder_StoppedBeforeSnapshot(t *testing.T) {
	dir := t.TempDir()
	store := outboxtest.OpenStore(t, outbox.DefaultConfig(filepath.Join(dir, "live.db")))
	rec, err := recording.NewRecorder(recording.Options{Logger: quiet, Dir: filepath.Join(dir, "rec"), Store: store, Snapshot: true,
		MaxBytes: recording.DefaultMaxBytes, Header: recording.Header{Feed: "ledger"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rec.Start(ctx, nil)
	if st := rec.Status(); st.Recording || st.Error != "" || st.File != "" {
		t.Fatalf("status %+v: want no run and no error", st)
	}
	if files := onDisk(t, filepath.Join(dir, "rec")); len(files) != 0 {
		t.Fatalf("files %v", files)
	}
}

// TestRecorder_RemovesUnfinishedSnapshots: a process killed while taking
// its run's snapshot leaves the temporary copy (and SQLite's journal)
// behind, or while creating a part its temporary file, which no recording
// refers to; the next start removes them, and
// only them: a finished snapshot, another feed's leftovers and a file
// that is not a recording stay, and the bytes on disk are counted after.
func TestRecorder_RemovesUnfinishedSnapshots(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv"),
		snapshotInterval: time.Hour}
	appendFile(t, r.input, lines(rng, 500))
	r.record(t)
	first := onDisk(t, r.dir)
	leftovers := []string{
		"ledger-20261201T000000.000000000Z.snapshot.db.tmp",
		"ledger-20261201T000000.000000000Z.snapshot.db.tmp-journal",
		"ledger-20261202T000000.000000000Z.snapshot.db.tmp-wal",
		"ledger-20261202T000000.000000000Z-0003.rec.tmp",
	}
	kept := []string{
		"other-20261201T000000.000000000Z.snapshot.db.tmp", // another feed's
		"ledger-notes.tmp", // not a recording's
		"ledger-20261202T000000.000000000Z-03.rec.tmp", // nor this
	}
	for i, n := range append(slices.Clone(leftovers), kept...) {
		if err := os.WriteFile(filepath.Join(r.dir, n), make([]byte, 1000+i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	appendFile(t, r.input, lines(rng, 500))
	st := r.record(t)
	files := onDisk(t, r.dir)
	for _, n := range leftovers {
		if _, ok := files[n]; ok {
			t.Errorf("%s is still there", n)
		}
	}
	for i, n := range kept {
		if files[n] != int64(1000+len(leftovers)+i) {
			t.Errorf("%s: %d bytes, want it kept whole", n, files[n])
		}
	}
	for n, sz := range first {
		if files[n] != sz {
			t.Errorf("the first run's %s: %d bytes, want %d kept", n, files[n], sz)
		}
	}
	var recorded int64 // the feed's recordings: what the status counts
	for n, sz := range files {
		if !slices.Contains(kept, n) {
			recorded += sz
		}
	}
	if st.DiskBytes != recorded {
		t.Fatalf("status counts %d bytes on disk, the recordings hold %d: %v", st.DiskBytes, recorded, files)
	}
}

// TestRecorder_RoomForTheSnapshot: a run that takes a new snapshot makes
// room for it under the total cap first, so that a process killed right
// after it started leaves the recordings within the cap: with the
// recordings under the cap by less than a snapshot, the start removes
// the oldest generations before it copies the database.
func TestRecorder_RoomForTheSnapshot(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv")}
	for range 3 {
		appendFile(t, r.input, lines(rng, 1500))
		r.record(t)
	}
	before := onDisk(t, r.dir)
	store := outboxtest.OpenStore(t, outbox.DefaultConfig(r.db))
	need, err := store.SnapshotBytes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if need == 0 {
		t.Fatal("a snapshot of the ledger's database needs 0 bytes")
	}
	capBytes := total(before) + need/2
	rec, err := recording.NewRecorder(recording.Options{Logger: quiet, Dir: r.dir, Store: store, Snapshot: true,
		MaxBytes: recording.DefaultMaxBytes, Retention: recording.Retention{MaxTotalBytes: capBytes},
		Header: recording.Header{Feed: "ledger"}})
	if err != nil {
		t.Fatal(err)
	}
	rec.Start(t.Context(), nil)
	defer rec.Close()
	after := onDisk(t, r.dir)
	st := rec.Status()
	newSnaps := 0
	for _, n := range names(after, ".snapshot.db") {
		if _, ok := before[n]; !ok {
			newSnaps++
			if after[n] != need {
				t.Errorf("the new snapshot %s holds %d bytes, estimated %d", n, after[n], need)
			}
		}
	}
	var removed int64
	for n, sz := range before {
		if _, ok := after[n]; !ok {
			removed += sz
		}
	}
	if !st.Recording || st.Paused != "" || newSnaps != 1 || removed == 0 || st.RemovedBytes != removed ||
		total(after) > capBytes || st.DiskBytes != total(after) {
		t.Fatalf("status %+v; cap %d; %d new snapshots; %d bytes removed; before %v, after %v (%d bytes)",
			st, capBytes, newSnaps, removed, before, after, total(after))
	}
}
