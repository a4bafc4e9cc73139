package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/outbox"
)

// replayJSON is the part of `server replay --json` the tests read.
type replayJSON struct {
	Verdict string   `json:"verdict"`
	Files   []string `json:"recordings"`
	Replay  struct {
		Items, Applied, ReplaysSkipped, DeadLettered, Outputs, EpochChanges, Losses, DecisionsDiffering int64
		Torn, Unconfirmed                                                                               []recording.TailReport
	} `json:"replay"`
	Diff *recording.DiffResult `json:"diff"`
}

// runReplay runs `server replay ARGS --json` and returns its report and
// exit code.
func runReplay(t *testing.T, args ...string) (replayJSON, int) {
	t.Helper()
	cmd := exec.Command(serverBin, append(append([]string{"replay"}, args...), "--json")...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	var rep replayJSON
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("server replay %v: exit %d, stderr %q: %v", args, cmd.ProcessState.ExitCode(), stderr.String(), jerr)
	}
	return rep, cmd.ProcessState.ExitCode()
}

// twoEpochs is a ledger written in two files, the first rotated away.
type twoEpochs struct{ a, b ledgerFile }

func (l twoEpochs) lines() int64 {
	return int64(len(l.a.valid) + len(l.a.malformed) + len(l.b.valid) + len(l.b.malformed))
}

func (l twoEpochs) balances() map[string]int64 {
	m := map[string]int64{}
	for k, v := range l.a.balances {
		m[k] += v
	}
	for k, v := range l.b.balances {
		m[k] += v
	}
	return m
}

// checkTwoEpochs checks the database holds the effects of l exactly once:
// the balances, and per epoch (in the order they came) one output per
// valid line and one dead letter per malformed line, at their positions.
func checkTwoEpochs(t *testing.T, db string, l twoEpochs) {
	t.Helper()
	ctx := context.Background()
	s := readStore(t, db)
	got, err := ledger.Balances(ctx, s, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if !equalBalances(got, l.balances()) {
		t.Fatalf("%s: balances differ from the files' sums", db)
	}
	type byTopic struct{ out, dlq []int64 }
	epochs := map[string]*byTopic{}
	var order []string
	for after := int64(0); ; {
		rows, err := s.Rows(ctx, after, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			e, ok := epochs[r.Epoch]
			if !ok {
				e = &byTopic{}
				epochs[r.Epoch] = e
				order = append(order, r.Epoch)
			}
			if r.Topic == "ledger.out" {
				e.out = append(e.out, r.Position)
			} else {
				e.dlq = append(e.dlq, r.Position)
			}
			after = r.ID
		}
	}
	if len(order) != 2 {
		t.Fatalf("%s: outputs of %d epochs, want 2", db, len(order))
	}
	for i, lf := range []ledgerFile{l.a, l.b} {
		checkPositions(t, fmt.Sprintf("%s epoch %d ledger.out", db, i+1), epochs[order[i]].out, lf.valid)
		checkPositions(t, fmt.Sprintf("%s epoch %d ledger.dlq", db, i+1), epochs[order[i]].dlq, lf.malformed)
	}
}

// rewindHalf returns the environment that makes the next run re-deliver
// the first half of what the database holds of lf (the second epoch), and
// how many lines that is; none when it holds nothing of it yet.
func rewindHalf(t *testing.T, db string, lf ledgerFile) ([]string, int64) {
	t.Helper()
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f, err := s.Feed(context.Background(), "ledger")
	if err != nil {
		t.Fatal(err)
	}
	cps, err := s.ReadPositions(context.Background(), "ledger")
	if err != nil || len(cps) != 1 {
		t.Fatalf("positions %+v, %v", cps, err)
	}
	if f.EpochChanges != 1 || cps[0].Position == 0 {
		return nil, 0
	}
	ends := slices.Sorted(slices.Values(append(slices.Clone(lf.valid), lf.malformed...)))
	rewind, replays := int64(0), int64(0)
	for _, e := range ends {
		if e <= cps[0].Position/2 {
			rewind = e
		}
	}
	for _, e := range ends {
		if e > rewind && e <= cps[0].Position {
			replays++
		}
	}
	return []string{"OUTBOXD_TEST_REWIND=ledger=" + itoa(rewind)}, replays
}

// ledgerFeed reads the ledger feed's counters and positions in the
// database at db, through a store of its own.
func ledgerFeed(db string) (outbox.FeedStats, []outbox.Checkpoint, error) {
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
	if err != nil {
		return outbox.FeedStats{}, nil, err
	}
	defer s.Close()
	f, err := s.Feed(context.Background(), "ledger")
	if err != nil {
		return outbox.FeedStats{}, nil, err
	}
	cps, err := s.ReadPositions(context.Background(), "ledger")
	return f, cps, err
}

// atEnd says whether the feed stands at position end of its second epoch,
// having skipped replays re-delivered items: a run that re-delivers what
// the database holds stands at the end before it starts, and is done only
// once it has skipped them all.
func atEnd(db string, end, replays int64) error {
	f, cps, err := ledgerFeed(db)
	if err != nil {
		return err
	}
	if f.EpochChanges != 1 || len(cps) != 1 || cps[0].Position != end || f.ReplaysSkipped < replays {
		return fmt.Errorf("epoch changes %d, positions %+v, replays skipped %d: want position %d of the second epoch, %d replays skipped",
			f.EpochChanges, cps, f.ReplaysSkipped, end, replays)
	}
	return nil
}

// rotate moves the file at path aside, as a log rotation does.
func rotate(t *testing.T, path string) {
	t.Helper()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
}

// TestRecord_KillNineReplay records a ledger feed across kill -9s at
// random moments and a rotation of its file, then replays every run's
// recording in order from the first snapshot: the outputs and balances
// are the live run's, exactly once by position, in both epochs; a second
// version of the processor reports the first line its changed rule
// refuses as the first divergent delivery; a recording cut short is
// reported as a torn tail at the exact offset.
func TestRecord_KillNineReplay(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 14))
	dir := t.TempDir()
	input, db, recDir := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "live.db"), filepath.Join(dir, "rec")
	l := twoEpochs{a: makeLedger(rng, 40_000), b: makeLedger(rng, 20_000)}
	args := []string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--relay", "none", "--http", "127.0.0.1:0", "--record", recDir}

	kills := 0
	killDuring := func(writing <-chan struct{}) {
		for done := false; !done; {
			p := start(t, nil, args...)
			time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond) // a random moment to crash at
			p.kill()
			kills++
			select {
			case <-writing:
				done = true
			default:
			}
		}
	}
	killDuring(appendSlowly(t, input, l.a.data, 3*time.Second, rng))
	// Rotated while the server is down: the old file is read to its end
	// first, then the new one is a new epoch.
	rotate(t, input)
	killDuring(appendSlowly(t, input, l.b.data, 2*time.Second, rng))
	t.Logf("%d kill -9s", kills)

	// The last run re-delivers lines of the second epoch it has: each is
	// recorded again, as a replay the guard skips.
	env, replays := rewindHalf(t, db, l.b)
	p := start(t, env, args...)
	wait(t, 60*time.Second, func() error { return atEnd(db, int64(len(l.b.data)), replays) })
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	checkTwoEpochs(t, db, l)
	if f, err := readStore(t, db).Feed(context.Background(), "ledger"); err != nil || f.ReplaysSkipped != replays {
		t.Fatalf("live replays skipped %d (%v), want %d", f.ReplaysSkipped, err, replays)
	}

	out := filepath.Join(dir, "replay.db")
	rep, code := runReplay(t, recDir, "--db", out, "--diff", db)
	t.Logf("%d recordings, %d torn tails, %d unconfirmed at the end", len(rep.Files), len(rep.Replay.Torn), len(rep.Replay.Unconfirmed))
	r := rep.Replay
	if code != 0 || rep.Verdict != "identical" || r.Items != l.lines()+replays || r.Applied != int64(len(l.a.valid)+len(l.b.valid)) ||
		r.DeadLettered != int64(len(l.a.malformed)+len(l.b.malformed)) || r.ReplaysSkipped != replays || r.Outputs != l.lines() ||
		r.EpochChanges != 2 || r.Losses != 0 || r.DecisionsDiffering != 0 || len(r.Unconfirmed) != 0 {
		t.Fatalf("exit %d, verdict %s, replay %+v: want identical, %d items, %d replays, 2 epochs", code, rep.Verdict, r, l.lines()+replays, replays)
	}
	if d := rep.Diff; d.Deliveries != l.lines() || d.OutputsDatabase != l.lines() || d.Positions != "" || len(d.Tables) != 1 || !d.Tables[0].Same() {
		t.Fatalf("diff %+v", d)
	}
	checkTorn(t, rep)
	checkTwoEpochs(t, out, l)

	t.Run("ChangedRule", func(t *testing.T) { changedRule(t, recDir, db, l) })
	t.Run("TornTail", func(t *testing.T) { tornTail(t, dir, recDir, rng, l.lines()+replays, r.Torn) })
}

// checkTorn checks the replay reported exactly the recordings whose tail
// the reader finds torn.
func checkTorn(t *testing.T, rep replayJSON) {
	t.Helper()
	var want []string
	for _, f := range rep.Files {
		rd, err := recording.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := rd.Next(); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if rd.Tail().Torn != "" {
			want = append(want, f)
		}
		rd.Close()
	}
	var got []string
	for _, tr := range rep.Replay.Torn {
		got = append(got, tr.File)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("torn tails reported %v, want %v", got, want)
	}
}

// strictLedger is a second version of the ledger: a debit over 900 is
// refused as malformed.
type strictLedger struct{ *ledger.Processor }

func (p strictLedger) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if e, err := ledger.Parse(bytes.TrimSuffix(item.Value, []byte("\r"))); err == nil && e.Amount < -900 {
		return ingest.Malformed("debit %d is over the limit of 900", -e.Amount)
	}
	return p.Processor.Apply(ctx, tx, d, item)
}

// changedRule replays the recordings with strictLedger (as a program
// using the packages would) and checks the divergence exactly: the
// refused lines, and every later line of an account a refusal changed.
func changedRule(t *testing.T, recDir, db string, l twoEpochs) {
	var divergent, firstPos int64 = 0, -1
	firstEpoch := 0
	off := map[string]int64{}
	for i, lf := range []ledgerFile{l.a, l.b} {
		lines := strings.SplitAfter(string(lf.data), "\n")
		pos := int64(0)
		for _, line := range lines {
			if line == "" {
				continue
			}
			pos += int64(len(line))
			e, err := ledger.Parse([]byte(strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")))
			switch {
			case err != nil:
			case e.Amount < -900:
				divergent++
				off[e.Account] -= e.Amount
				if firstPos < 0 {
					firstPos, firstEpoch = pos, i
				}
			case off[e.Account] != 0:
				divergent++
			}
		}
	}
	if firstPos < 0 {
		t.Fatal("no line the new rule refuses: the test could not fail")
	}
	ctx := context.Background()
	set, err := recording.Scan([]string{recDir})
	if err != nil {
		t.Fatal(err)
	}
	store, _, err := recording.OpenTarget(ctx, set, filepath.Join(t.TempDir(), "v2.db"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sum, err := recording.Replay(ctx, recording.ReplayConfig{Set: set, Store: store,
		Processor: strictLedger{ledger.New("ledger.out")}, ProcessorName: "ledger-v2", Logger: quietLog, KeepPlaces: true})
	if err != nil {
		t.Fatal(err)
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
	if res.Identical || res.Divergent != divergent || res.First == nil || res.First.Position != firstPos ||
		res.First.Got[0].Topic != "ledger.dlq" || res.First.Expected[0].Topic != "ledger.out" {
		t.Fatalf("diff %+v, first %+v: want %d divergent, the first at position %d of epoch %d", res, res.First, divergent, firstPos, firstEpoch+1)
	}
	if sum.FirstDiffering == nil || sum.FirstDiffering.Position != firstPos {
		t.Fatalf("first differing decision %+v, want position %d", sum.FirstDiffering, firstPos)
	}
}

// tornTail cuts a copy of the last recording inside one of its
// transactions: the replay reports the tail from that transaction's start
// to the cut.
//
// before are the tails the kill -9s tore already: they are reported as
// before, beside the cut one.
func tornTail(t *testing.T, dir, recDir string, rng *rand.Rand, lines int64, before []recording.TailReport) {
	cut := filepath.Join(dir, "cut")
	if err := os.CopyFS(cut, os.DirFS(recDir)); err != nil {
		t.Fatal(err)
	}
	paths, _ := filepath.Glob(filepath.Join(cut, "*.rec"))
	slices.Sort(paths)
	last := paths[len(paths)-1]
	rd, err := recording.Open(last)
	if err != nil {
		t.Fatal(err)
	}
	var txns []recording.Txn
	for {
		txn, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		txns = append(txns, txn)
	}
	rd.Close()
	if len(txns) < 2 {
		t.Skipf("the last run's recording holds %d transactions: nothing to cut", len(txns))
	}
	k := 1 + rng.IntN(len(txns)-1)
	data, err := os.ReadFile(last)
	if err != nil {
		t.Fatal(err)
	}
	// Inside the head of transaction k's first record, as a kill in the
	// middle of its write leaves it.
	at := txns[k].Offset + 1 + rng.Int64N(9)
	if err := os.WriteFile(last, data[:at], 0o644); err != nil {
		t.Fatal(err)
	}
	lost := int64(0) // the items of the transactions cut off
	for _, txn := range txns[k:] {
		for _, e := range txn.Entries {
			if e.Record.Kind == ingest.RecordItem {
				lost++
			}
		}
	}
	want := []recording.TailReport{}
	for _, tr := range before {
		if filepath.Base(tr.File) != filepath.Base(last) {
			tr.File, tr.Why = filepath.Join(cut, filepath.Base(tr.File)), ""
			want = append(want, tr)
		}
	}
	want = append(want, recording.TailReport{File: last, Offset: txns[k].Offset, Bytes: at - txns[k].Offset})
	rep, code := runReplay(t, cut)
	got := slices.Clone(rep.Replay.Torn)
	for i := range got {
		got[i].Why = ""
	}
	byFile := func(a, b recording.TailReport) int { return strings.Compare(a.File, b.File) }
	slices.SortFunc(got, byFile)
	slices.SortFunc(want, byFile)
	if code != 0 || !slices.Equal(got, want) || rep.Replay.Items != lines-lost {
		t.Fatalf("exit %d, items %d, torn %+v: want torn %+v, %d items", code, rep.Replay.Items, rep.Replay.Torn, want, lines-lost)
	}
}

var quietLog = slog.New(slog.DiscardHandler)

// TestRecord_DamageReported records a run of the server in parts, ended
// by SIGTERM, and damages copies of it as a disk or an operator might:
// each `server replay` exits 2 with one line naming the file and the byte
// offset, never a crash's tail replayed around: a middle part's commit
// record damaged, the final part's last record damaged, the last two
// parts deleted. The undamaged recording replays whole.
func TestRecord_DamageReported(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	dir := t.TempDir()
	input, db, recDir := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "live.db"), filepath.Join(dir, "rec")
	l := makeLedger(rng, 60_000)
	if err := os.WriteFile(input, l.data, 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, nil, "--db", db, "--feed", "ledger=file:"+input, "--processor", "ledger=ledger", "--relay", "none",
		"--http", "127.0.0.1:0", "--record", recDir, "--record-max-bytes", "65536")
	wait(t, 60*time.Second, func() error {
		f, cps, err := ledgerFeed(db)
		if err != nil || len(cps) != 1 || cps[0].Position != int64(len(l.data)) {
			return fmt.Errorf("positions %+v (%+v, %v), want %d", cps, f, err, len(l.data))
		}
		return nil
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	paths, _ := filepath.Glob(filepath.Join(recDir, "*.rec"))
	slices.Sort(paths)
	if len(paths) < 4 {
		t.Fatalf("%d parts, want 4 or more", len(paths))
	}
	if rep, code := runReplay(t, recDir); code != 0 || rep.Replay.Items != int64(len(l.valid)+len(l.malformed)) {
		t.Fatalf("the whole recording: exit %d, %+v", code, rep.Replay)
	}
	// ends reads a part: where its end record starts, and where its last
	// commit record does (-1 when it holds no transaction).
	ends := func(path string) (end, commit int64) {
		rd, err := recording.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		var last recording.Txn
		for {
			txn, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			last = txn
		}
		end = rd.Tail().EndOffset
		if last.Number == 0 {
			return end, -1
		}
		var n [10]byte
		return end, end - int64(2+4+4+1+binary.PutUvarint(n[:], last.Number))
	}
	// damaged copies the recording, changing it with f, and wants the
	// replay of the copy to exit 2 with the one line want(copy's dir).
	damaged := func(t *testing.T, f func(dir string), want func(dir string) string) {
		t.Helper()
		cp := t.TempDir()
		if err := os.CopyFS(cp, os.DirFS(recDir)); err != nil {
			t.Fatal(err)
		}
		f(cp)
		cmd := exec.Command(serverBin, "replay", cp)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Run()
		if w := want(cp); cmd.ProcessState.ExitCode() != 2 || stderr.String() != w {
			t.Fatalf("exit %d, stderr %q, stdout %q\nwant exit 2, %q", cmd.ProcessState.ExitCode(), stderr.String(), stdout.String(), w)
		}
	}
	flip := func(path string, at int64) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		data[at] ^= 0x5a
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	in := func(dir, path string) string { return filepath.Join(dir, filepath.Base(path)) }
	last := len(paths) - 1

	t.Run("MiddleCommitDamaged", func(t *testing.T) {
		end, commit := ends(paths[1])
		damaged(t, func(cp string) { flip(in(cp, paths[1]), commit+2+4+4) }, func(cp string) string {
			return fmt.Sprintf("server replay: recording %s: recording damaged: offset %d: a record whose checksum does not match, "+
				"yet a whole record follows at offset %d\n", in(cp, paths[1]), commit, end)
		})
	})
	t.Run("FinalLastRecordDamaged", func(t *testing.T) {
		end, _ := ends(paths[last])
		st, err := os.Stat(paths[last])
		if err != nil {
			t.Fatal(err)
		}
		damaged(t, func(cp string) { flip(in(cp, paths[last]), st.Size()-1) }, func(cp string) string {
			return fmt.Sprintf("server replay: recording %s: recording damaged: offset %d: a record whose checksum does not match: "+
				"a crash cuts a record short, it does not change one\n", in(cp, paths[last]), end)
		})
	})
	t.Run("LastTwoPartsDeleted", func(t *testing.T) {
		end, _ := ends(paths[last-2])
		damaged(t, func(cp string) {
			for _, p := range paths[last-1:] {
				if err := os.Remove(in(cp, p)); err != nil {
					t.Fatal(err)
				}
			}
		}, func(cp string) string {
			return fmt.Sprintf("server replay: recordings do not make one replay: %s: offset %d names the part that follows it, %s, "+
				"which is missing: the run's later parts are gone\n", in(cp, paths[last-2]), end, in(cp, paths[last-1]))
		})
	})
}
