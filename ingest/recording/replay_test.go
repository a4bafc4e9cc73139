package recording_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/ingest/testseam"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// lines makes n ledger lines, one in 50 malformed; amounts -1000..1000.
func lines(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		if rng.IntN(50) == 0 {
			b.WriteString("not a ledger line\n")
			continue
		}
		fmt.Fprintf(&b, "acct-%02d,%d\n", rng.IntN(30), rng.IntN(2001)-1000)
	}
	return b.String()
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// run is one recorded run of a ledger feed over a file.
type run struct {
	dir, db, input string
	maxBytes       int64
	rewind         map[int32]int64
	// retention, snapshotInterval and now go to the recorder's options;
	// during, when set, runs once the loop runs, before the wait for the
	// input's end.
	retention        recording.Retention
	snapshotInterval time.Duration
	now              func() time.Time
	during           func(rec *recording.Recorder)
}

// record runs the loop with a recorder until the feed has applied the
// whole input, then stops it, and returns the recorder's last status.
func (r run) record(t *testing.T) recording.Status {
	t.Helper()
	ctx := context.Background()
	store, err := outbox.Open(ctx, outbox.DefaultConfig(r.db))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	cfg := ingest.DefaultConfig("ledger")
	cfg.Processor = ledger.Name
	cfg.BatchMax = 500 // several transactions per run
	cfg.Logger = quiet
	maxBytes := r.maxBytes
	if maxBytes == 0 {
		maxBytes = recording.DefaultMaxBytes
	}
	rec, err := recording.NewRecorder(recording.Options{
		Logger: quiet, Dir: r.dir, Store: store, Snapshot: true, MaxBytes: maxBytes,
		Retention: r.retention, SnapshotInterval: r.snapshotInterval, Now: r.now,
		Header: recording.Header{Feed: "ledger", Kind: ingest.KindFile, Source: r.input, Processor: ledger.Name,
			Loop: recording.LoopSettings{BatchMax: cfg.BatchMax, RetryAttempts: cfg.Retry.Attempts, OnFailure: cfg.OnFailure,
				OnCompletionFailure: cfg.OnCompletionFailure, MaxMessageBytes: cfg.MaxMessageBytes, DeadLetterTopic: "ledger.dlq"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Recorder = rec
	var feed ingest.Feed = filefeed.New(r.input, filefeed.Options{Logger: quiet})
	if r.rewind != nil {
		feed = testseam.Rewound(feed, r.rewind)
	}
	loop, err := ingest.NewLoop(store, feed, ledger.New("ledger.out"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- loop.Run(rctx) }()
	if r.during != nil {
		r.during(rec)
	}
	waitFor(t, func() error {
		st, err := os.Stat(r.input)
		if err != nil {
			return err
		}
		cps, err := store.ReadPositions(ctx, "ledger")
		if err != nil {
			return err
		}
		if len(cps) != 1 || cps[0].Position != st.Size() {
			return fmt.Errorf("positions %+v, want %d", cps, st.Size())
		}
		return nil
	})
	stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if s := rec.Status(); s.Recording || s.Error != "" || (s.Bytes == 0 && s.Paused == "") {
		t.Fatalf("recorder status after the run: %+v", s)
	}
	return rec.Status()
}

func waitFor(t *testing.T, cond func() error) {
	t.Helper()
	testutil.Wait(t, 30*time.Second, cond)
}

// replay replays the recordings into out with proc and, when db is not
// "", diffs the result against it.
func replay(t *testing.T, out, db string, proc ingest.Processor, paths ...string) (recording.Summary, recording.DiffResult, error) {
	t.Helper()
	ctx := context.Background()
	set, err := recording.Scan(paths)
	if err != nil {
		return recording.Summary{}, recording.DiffResult{}, err
	}
	store, _, err := recording.OpenTarget(ctx, set, out, "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sum, err := recording.Replay(ctx, recording.ReplayConfig{Set: set, Store: store, Processor: proc, ProcessorName: "ledger", Logger: quiet, KeepPlaces: true})
	if err != nil || db == "" {
		return sum, recording.DiffResult{}, err
	}
	live, err := outbox.OpenExisting(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	res, err := recording.Diff(ctx, store, live, "ledger", sum.Places)
	if err != nil {
		t.Fatal(err)
	}
	return sum, res, nil
}

func recordings(t *testing.T, dir string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.rec"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no recordings in %s (%v)", dir, err)
	}
	return paths
}

// counts is what a ledger input holds.
type counts struct{ lines, valid, malformed int }

func countOf(s string) counts {
	var c counts
	for _, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		c.lines++
		if _, err := ledger.Parse([]byte(l)); err == nil {
			c.valid++
		} else {
			c.malformed++
		}
	}
	return c
}

func checkSummary(t *testing.T, sum recording.Summary, c counts, replays int64) {
	t.Helper()
	if sum.Items != int64(c.lines)+replays || sum.Applied != int64(c.valid) || sum.DeadLettered != int64(c.malformed) ||
		sum.ReplaysSkipped != replays || sum.Outputs != int64(c.lines) || sum.DecisionsDiffering != 0 ||
		sum.EpochChanges != 1 || len(sum.Torn) != 0 || len(sum.Unconfirmed) != 0 {
		t.Fatalf("summary %+v: want items %d, applied %d, dead letters %d, replays %d, outputs %d, one epoch, nothing differing",
			sum, c.lines+int(replays), c.valid, c.malformed, replays, c.lines)
	}
}

func checkIdentical(t *testing.T, res recording.DiffResult, deliveries int) {
	t.Helper()
	if !res.Identical || res.Deliveries != int64(deliveries) || res.Divergent != 0 || res.OutputsReplayed != int64(deliveries) ||
		res.OutputsDatabase != int64(deliveries) || res.Positions != "" || len(res.Tables) != 1 || res.Tables[0].Table != "ledger_balances" ||
		res.Tables[0].RowsReplayed == 0 || !res.Tables[0].Same() {
		t.Fatalf("diff %+v (tables %+v): want identical over %d deliveries", res, res.Tables, deliveries)
	}
}

// TestReplay_TwoRuns records a ledger feed over two runs (the second
// re-delivering items it skips as replays), replays both recordings from
// the first snapshot, and finds outputs and balances identical to the live
// database's; the second alone, from its own snapshot, too.
func TestReplay_TwoRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv")}
	first, second := lines(rng, 3000), lines(rng, 2000)
	appendFile(t, r.input, first)
	r.record(t)
	appendFile(t, r.input, second)
	// Re-delivers the last lines of the first part: from a line's start, as
	// a stored position always is (the feed takes any other for a cut file).
	rewindTo := int64(strings.LastIndexByte(first[:len(first)-40], '\n') + 1)
	r.rewind = map[int32]int64{0: rewindTo}
	r.record(t)
	paths := recordings(t, r.dir)
	if len(paths) != 2 {
		t.Fatalf("recordings %v, want one per run", paths)
	}
	replays := int64(strings.Count(first[rewindTo:], "\n"))
	all := countOf(first + second)

	sum, res, err := replay(t, filepath.Join(dir, "out.db"), r.db, ledger.New("ledger.out"), paths...)
	if err != nil {
		t.Fatal(err)
	}
	checkSummary(t, sum, all, replays)
	checkIdentical(t, res, all.lines)

	t.Run("SecondFromItsSnapshot", func(t *testing.T) {
		sum, res, err := replay(t, filepath.Join(dir, "out2.db"), r.db, ledger.New("ledger.out"), paths[1])
		if err != nil {
			t.Fatal(err)
		}
		c := countOf(second)
		if sum.Applied != int64(c.valid) || sum.ReplaysSkipped != replays || sum.Outputs != int64(c.lines) || sum.EpochChanges != 0 {
			t.Fatalf("summary %+v: want applied %d, replays %d, outputs %d", sum, c.valid, replays, c.lines)
		}
		if !res.Identical || res.Deliveries != int64(c.lines) {
			t.Fatalf("diff %+v: want identical over %d deliveries", res, c.lines)
		}
	})
	t.Run("ErrBadSetWrongStart", func(t *testing.T) {
		out := filepath.Join(dir, "out3.db")
		if _, _, err := replay(t, out, "", ledger.New("ledger.out"), paths[0]); err != nil {
			t.Fatal(err)
		}
		_, _, err := replay(t, out, "", ledger.New("ledger.out"), paths[0]) // out is past it now
		if !recording.IsBad(err) || !strings.Contains(err.Error(), "the database stands at [0]") {
			t.Fatalf("err %v, want ErrBadSet saying where the database stands", err)
		}
	})
	t.Run("SnapshotIsNeverClaimed", func(t *testing.T) {
		snaps, _ := filepath.Glob(filepath.Join(r.dir, "*.snapshot.db"))
		if len(snaps) != 2 {
			t.Fatalf("snapshots %v, want one per run", snaps)
		}
		for _, p := range append(snaps, filepath.Join(dir, "out.db")) {
			s, err := outbox.Open(context.Background(), outbox.DefaultConfig(p))
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Claim(context.Background())
			s.Close()
			if !errors.Is(err, outbox.ErrReplayCopy) {
				t.Fatalf("claim %s: %v, want ErrReplayCopy", p, err)
			}
		}
	})
}

// TestReplay_Tails cuts the first run's recording: a cut inside its last
// transaction is a torn tail (reported; the transactions before it
// replay), and makes the set not join the second run's; a cut of only its
// last commit frame leaves the transaction unconfirmed, which the second
// run's recording confirms.
func TestReplay_Tails(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv")}
	first, second := lines(rng, 2000), lines(rng, 500)
	appendFile(t, r.input, first)
	r.record(t)
	appendFile(t, r.input, second)
	r.record(t)
	paths := recordings(t, r.dir)
	data, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	last, committed := lastTxn(t, paths[0])
	commitFrame := int64(2 + 4 + 4 + 1 + len(binary.AppendUvarint(nil, last.Number)))

	t.Run("Torn", func(t *testing.T) {
		cut := last.Offset + 7 // in its first record
		torn := filepath.Join(dir, "torn", filepath.Base(paths[0]))
		writeCut(t, torn, data, cut, filepath.Join(r.dir, snapshotOf(t, paths[0])))
		sum, _, err := replay(t, filepath.Join(dir, "torn.db"), "", ledger.New("ledger.out"), torn)
		if err != nil {
			t.Fatal(err)
		}
		want := committed - itemsOf(last)
		if len(sum.Torn) != 1 || sum.Torn[0].Offset != last.Offset || sum.Torn[0].Bytes != 7 || sum.Items != want || want == 0 {
			t.Fatalf("summary %+v (torn %+v): want the tail at %d, 7 bytes, and %d items replayed", sum, sum.Torn, last.Offset, want)
		}
		tornNext := filepath.Join(dir, "torn", filepath.Base(paths[1]))
		writeCut(t, tornNext, mustRead(t, paths[1]), -1, "")
		if _, _, err := replay(t, filepath.Join(dir, "torn2.db"), "", ledger.New("ledger.out"), torn, tornNext); !recording.IsBad(err) ||
			!strings.Contains(err.Error(), "a recording between them is missing") {
			t.Fatalf("err %v, want ErrBadSet: they do not join", err)
		}
	})
	t.Run("Unconfirmed", func(t *testing.T) {
		cut := endOfRun(t, paths[0]) - commitFrame
		dirU := filepath.Join(dir, "unconfirmed")
		u := filepath.Join(dirU, filepath.Base(paths[0]))
		writeCut(t, u, data, cut, filepath.Join(r.dir, snapshotOf(t, paths[0])))
		sum, _, err := replay(t, filepath.Join(dir, "u1.db"), "", ledger.New("ledger.out"), u)
		if err != nil {
			t.Fatal(err)
		}
		if len(sum.Unconfirmed) != 1 || sum.Unconfirmed[0].Offset != last.Offset || sum.Items != committed-itemsOf(last) {
			t.Fatalf("summary %+v (unconfirmed %+v): want transaction at %d unconfirmed, %d items", sum, sum.Unconfirmed, last.Offset,
				committed-itemsOf(last))
		}
		next := filepath.Join(dirU, filepath.Base(paths[1]))
		writeCut(t, next, mustRead(t, paths[1]), -1, "")
		sum, res, err := replay(t, filepath.Join(dir, "u2.db"), r.db, ledger.New("ledger.out"), u, next)
		if err != nil {
			t.Fatal(err)
		}
		all := countOf(first + second)
		checkSummary(t, sum, all, 0)
		checkIdentical(t, res, all.lines)
	})
}

// lastTxn returns the last committed transaction of a recording and the
// items of all of them.
func lastTxn(t *testing.T, path string) (recording.Txn, int64) {
	t.Helper()
	rd, err := recording.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var last recording.Txn
	var items int64
	for {
		txn, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return last, items
		}
		if err != nil {
			t.Fatal(err)
		}
		last = txn
		items += itemsOf(txn)
	}
}

// endOfRun is where the frame that ends the run's recording starts in
// path: the file's last transaction ends there.
func endOfRun(t *testing.T, path string) int64 {
	t.Helper()
	set, err := recording.Scan([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	tail := set.Files[0].Tail
	if !tail.Ended {
		t.Fatalf("%s does not end its run: tail %+v", path, tail)
	}
	return tail.EndOffset
}

func itemsOf(txn recording.Txn) int64 {
	n := int64(0)
	for _, e := range txn.Entries {
		if e.Record.Kind == ingest.RecordItem {
			n++
		}
	}
	return n
}

func snapshotOf(t *testing.T, path string) string {
	t.Helper()
	rd, err := recording.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	return rd.Header().Snapshot
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeCut writes data (up to cut, when not -1) at path, and a copy of
// the snapshot snap beside it.
func writeCut(t *testing.T, path string, data []byte, cut int64, snap string) {
	t.Helper()
	if cut >= 0 {
		data = data[:cut]
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if snap != "" {
		if err := os.WriteFile(filepath.Join(filepath.Dir(path), filepath.Base(snap)), mustRead(t, snap), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// strictLedger is a second version of the ledger, with a changed rule: a
// debit of more than 900 is refused as malformed.
type strictLedger struct{ *ledger.Processor }

func (p strictLedger) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if e, err := ledger.Parse(item.Value); err == nil && e.Amount < -900 {
		return ingest.Malformed("debit %d is over the limit of 900", -e.Amount)
	}
	return p.Processor.Apply(ctx, tx, d, item)
}

// TestReplay_ChangedRule replays a recording with a second version of the
// processor: the decisions and outputs that differ are counted exactly,
// and the first divergent delivery is the first line the new rule refuses.
func TestReplay_ChangedRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv")}
	input := lines(rng, 4000)
	appendFile(t, r.input, input)
	r.record(t)

	// What the new rule changes: refused lines, and every later line of
	// an account whose balance a refusal changed.
	var refused, divergent int64
	firstRefused := int64(-1)
	pos, off := int64(0), map[string]int64{}
	for _, l := range strings.Split(strings.TrimSuffix(input, "\n"), "\n") {
		pos += int64(len(l) + 1)
		e, err := ledger.Parse([]byte(l))
		switch {
		case err != nil:
		case e.Amount < -900:
			refused++
			divergent++
			off[e.Account] -= e.Amount
			if firstRefused < 0 {
				firstRefused = pos
			}
		case off[e.Account] != 0:
			divergent++
		}
	}
	if refused == 0 {
		t.Fatal("the input has no line the new rule refuses: the test could not fail")
	}
	sum, res, err := replay(t, filepath.Join(dir, "v2.db"), r.db, strictLedger{ledger.New("ledger.out")}, recordings(t, r.dir)...)
	if err != nil {
		t.Fatal(err)
	}
	if sum.DecisionsDiffering != refused || sum.FirstDiffering == nil || sum.FirstDiffering.Position != firstRefused ||
		sum.FirstDiffering.Recorded != "applied" || sum.FirstDiffering.Replayed != "dead-lettered malformed" {
		t.Fatalf("summary %+v (first %+v): want %d decisions differing, the first at %d", sum, sum.FirstDiffering, refused, firstRefused)
	}
	if res.Identical || res.Divergent != divergent || res.First == nil || res.First.Position != firstRefused ||
		len(res.First.Expected) != 1 || res.First.Expected[0].Topic != "ledger.out" || len(res.First.Got) != 1 || res.First.Got[0].Topic != "ledger.dlq" {
		t.Fatalf("diff %+v (first %+v): want %d divergent, the first at %d, ledger.out expected, ledger.dlq got", res, res.First, divergent, firstRefused)
	}
	if res.DivergentTables != 1 || res.Tables[0].Differing == 0 || res.Tables[0].FirstKey == "" {
		t.Fatalf("tables %+v: want ledger_balances divergent with its first key", res.Tables)
	}
}

// TestRecorder_Rotates records into files of at most about 64 KiB: the
// run's parts each start where the one before ended, none splits a
// transaction, and together they replay to the live state.
func TestRecorder_Rotates(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv"),
		maxBytes: recording.MinMaxBytes}
	input := lines(rng, 6000)
	appendFile(t, r.input, input)
	st := r.record(t)
	paths := recordings(t, r.dir)
	if len(paths) < 3 || st.Files != len(paths) || !strings.HasSuffix(st.File, fmt.Sprintf("-%04d.rec", len(paths))) {
		t.Fatalf("status %+v, files %v: want three parts or more", st, paths)
	}
	var total int64
	for i, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
		set, err := recording.Scan([]string{p})
		if err != nil {
			t.Fatal(err)
		}
		f := set.Files[0]
		if f.Header.Part != i+1 || f.Tail.Bytes != 0 || (i < len(paths)-1 && fi.Size() < recording.MinMaxBytes) {
			t.Fatalf("part %s: header %+v, tail %+v, size %d", p, f.Header, f.Tail, fi.Size())
		}
		if (i == 0) != (f.Header.Snapshot != "") {
			t.Fatalf("part %d: snapshot %q: only the first part has one", i+1, f.Header.Snapshot)
		}
	}
	if total != st.Bytes {
		t.Fatalf("status says %d bytes, the files hold %d", st.Bytes, total)
	}
	sum, res, err := replay(t, filepath.Join(dir, "out.db"), r.db, ledger.New("ledger.out"), r.dir)
	if err != nil {
		t.Fatal(err)
	}
	c := countOf(input)
	checkSummary(t, sum, c, 0)
	checkIdentical(t, res, c.lines)
}

// TestOpenTarget_RefusesLiveDatabase: a replay never writes into a
// database it did not make, nor marks it.
func TestOpenTarget_RefusesLiveDatabase(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	dir := t.TempDir()
	r := run{dir: filepath.Join(dir, "rec"), db: filepath.Join(dir, "live.db"), input: filepath.Join(dir, "ledger.csv")}
	appendFile(t, r.input, lines(rng, 100))
	r.record(t)
	set, err := recording.Scan(recordings(t, r.dir))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := recording.OpenTarget(context.Background(), set, r.db, ""); !errors.Is(err, recording.ErrNotReplayCopy) {
		t.Fatalf("err %v, want ErrNotReplayCopy", err)
	}
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(r.db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Claim(context.Background()); err != nil {
		t.Fatalf("the live database cannot be claimed after a refused replay: %v", err)
	}
}
