package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
)

// flInput is a ledger input file that the test rotates, truncates and
// copies, with the model of what applying it exactly once must give: every
// epoch the feed must read, in order, with the bytes it holds.
type flInput struct {
	fail   func(error) // t.Fatal, or the writer goroutine's way out
	rng    *rand.Rand
	path   string
	epochs []*flEpoch
	cur    *flEpoch // the epoch of the file at the path; nil until its first write
	gen    int      // the file at the path started over in place this often
}

// flEpoch is one epoch of the feed: a file (or one life of a file truncated
// in place) and the bytes it was given.
type flEpoch struct {
	epoch string // its name when the feed reads it in place: dev:ino:fp[:tN]
	fp    string
	// inodes are the "dev:ino" of the file and of the copies that hold this
	// epoch whole: a feed that reaches a copy before it read any of the
	// epoch in place reads it there, in the copy's identity (and counts the
	// file's next generation from that).
	inodes []string
	data   []byte
}

// named reports whether the stored epoch name is e's: e's fingerprint, on
// e's file or on one of its copies, whatever generation it counts.
func (e *flEpoch) named(name string) bool {
	parts := strings.Split(name, ":")
	return len(parts) >= 3 && parts[2] == e.fp && slices.Contains(e.inodes, parts[0]+":"+parts[1])
}

// epochOf returns the epoch of in that the stored name stands for, or nil.
func (in *flInput) epochOf(name string) *flEpoch {
	var found *flEpoch
	for _, e := range in.epochs {
		if e.epoch == name {
			return e
		}
		if found == nil && e.named(name) {
			found = e
		}
	}
	return found
}

// flLoss is a loss as the status lists it.
type flLoss struct {
	reason, epoch string
	from, to      int64
}

func flNewInput(t *testing.T, rng *rand.Rand, dir string) *flInput {
	return &flInput{fail: func(err error) { t.Helper(); t.Fatal(err) }, rng: rng, path: filepath.Join(dir, "ledger.csv")}
}

// write appends n fresh ledger lines to the file at the path, in writes of
// whole lines, creating it if need be.
func (in *flInput) write(n int) {
	data := makeLedger(in.rng, n).data
	f, err := os.OpenFile(in.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		in.fail(err)
	}
	defer f.Close()
	for len(data) > 0 {
		end := len(data)
		if cut := min(len(data)-1, in.rng.IntN(4096)); bytes.IndexByte(data[cut:], '\n') >= 0 {
			end = cut + bytes.IndexByte(data[cut:], '\n') + 1
		}
		if _, err := f.Write(data[:end]); err != nil {
			in.fail(err)
		}
		in.note(data[:end])
		data = data[end:]
	}
}

// note adds written bytes to the model, starting the path's epoch at its
// first line.
func (in *flInput) note(b []byte) {
	if in.cur == nil {
		fi, err := os.Stat(in.path)
		if err != nil {
			in.fail(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		first := b[:bytes.IndexByte(b, '\n')+1]
		h := fnv.New64a()
		h.Write(first)
		ino, fp := fmt.Sprintf("%d:%d", st.Dev, st.Ino), fmt.Sprintf("%016x", h.Sum64())
		e := ino + ":" + fp
		if in.gen > 0 {
			e += ":t" + strconv.Itoa(in.gen)
		}
		in.cur = &flEpoch{epoch: e, fp: fp, inodes: []string{ino}}
		in.epochs = append(in.epochs, in.cur)
	}
	in.cur.data = append(in.cur.data, b...)
}

// shift renames every path.N to path.N+1, oldest first, so that path.1 is
// free.
func (in *flInput) shift() {
	n := 0
	for {
		if _, err := os.Stat(in.path + "." + strconv.Itoa(n+1)); err != nil {
			break
		}
		n++
	}
	for ; n >= 1; n-- {
		if err := os.Rename(in.path+"."+strconv.Itoa(n), in.path+"."+strconv.Itoa(n+1)); err != nil {
			in.fail(err)
		}
	}
}

// rotate moves the file away the numbered way (logrotate's default): every
// path.N becomes path.N+1, then the path becomes path.1; the next write
// creates the path again.
func (in *flInput) rotate() {
	in.shift()
	in.rename(".1")
}

// rename moves the file away to path+suffix (a dated scheme: suffixes in
// the order of the rotations).
func (in *flInput) rename(suffix string) {
	if err := os.Rename(in.path, in.path+suffix); err != nil {
		in.fail(err)
	}
	in.cur, in.gen = nil, 0
}

// copyTruncate does what logrotate's copytruncate does: shifts the numbered
// copies, copies the file to path.1 (withCopy) and truncates it in place.
// Without the copy, the bytes of the epoch past from are lost: the model
// keeps only the ones applied.
func (in *flInput) copyTruncate(withCopy bool, from int64) {
	data, err := os.ReadFile(in.path)
	if err != nil {
		in.fail(err)
	}
	if withCopy {
		in.shift()
		if err := os.WriteFile(in.path+".1", data, 0o644); err != nil {
			in.fail(err)
		}
		fi, err := os.Stat(in.path + ".1")
		if err != nil {
			in.fail(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		in.cur.inodes = append(in.cur.inodes, fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	} else {
		in.cur.data = in.cur.data[:from]
	}
	if err := os.Truncate(in.path, 0); err != nil {
		in.fail(err)
	}
	in.cur = nil
	in.gen++
}

// last returns the epoch the feed ends in and the position of its end.
func (in *flInput) last() (*flEpoch, int64) {
	e := in.epochs[len(in.epochs)-1]
	return e, int64(len(e.data))
}

// flArgs are the server's arguments for the ledger feed on in.
func flArgs(db string, in *flInput) []string {
	return []string{"--db", db, "--feed", "ledger=file:" + in.path, "--processor", "ledger=ledger",
		"--relay", "none", "--http", "127.0.0.1:0"}
}

// flWaitAt waits until the feed's stored checkpoint is at pos in epoch.
func flWaitAt(t *testing.T, db string, epoch *flEpoch, pos int64) {
	t.Helper()
	wait(t, 60*time.Second, func() error {
		s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
		if err != nil {
			return err
		}
		defer s.Close()
		cps, err := s.ReadPositions(context.Background(), "ledger")
		if err != nil || len(cps) == 0 {
			return fmt.Errorf("no stored position yet (%v)", err)
		}
		if !epoch.named(cps[0].Epoch) || cps[0].Position != pos {
			return fmt.Errorf("stored %s@%d, want %s@%d", cps[0].Epoch, cps[0].Position, epoch.epoch, pos)
		}
		return nil
	})
}

// flCheck checks the database holds exactly the effects of in's epochs,
// each line applied once in its epoch at its position, each epoch under one
// name, and exactly losses (epochs by their model names); and that the
// running server p (nil: none) reports the same.
func flCheck(t *testing.T, db string, in *flInput, losses []flLoss, p *proc) {
	t.Helper()
	ctx := context.Background()
	s := readStore(t, db)
	balances := map[string]int64{}
	var valid, malformed int
	want := map[*flEpoch][2][]int64{} // outputs, dead letters
	for _, e := range in.epochs {
		lf := flParse(e.data)
		for a, b := range lf.balances {
			balances[a] += b
		}
		valid, malformed = valid+len(lf.valid), malformed+len(lf.malformed)
		want[e] = [2][]int64{lf.valid, lf.malformed}
	}
	f, err := s.Feed(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	flCheckRows(t, s, in, want)
	if f.Applied != int64(valid) || f.DeadLettered != int64(malformed) || f.ReplaysSkipped != 0 ||
		f.CompletionFailures != 0 || f.Lossless != (len(losses) == 0) || f.EpochChanges != int64(len(in.epochs)-1) {
		t.Fatalf("stats %+v: want applied %d, deadLettered %d, no replays, epochChanges %d, lossless %v",
			f, valid, malformed, len(in.epochs)-1, len(losses) == 0)
	}
	got, err := ledger.Balances(ctx, s, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if !equalBalances(got, balances) {
		t.Fatalf("balances differ from the sums of the lines applied:\n got %v\nwant %v", got, balances)
	}
	flCheckDeadLetters(t, s, in, want, malformed)
	stored, err := s.Losses(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	var gotLosses []flLoss
	for _, l := range stored {
		gotLosses = append(gotLosses, flLoss{l.Reason, flModelName(in, l.Epoch), l.From, l.To})
	}
	if !slices.Equal(gotLosses, losses) {
		t.Fatalf("losses %+v, want %+v", gotLosses, losses)
	}
	if ok, err := s.IntegrityCheck(ctx); err != nil || ok != "ok" {
		t.Fatalf("integrity_check = %q, %v", ok, err)
	}
	if p != nil {
		epoch, end := in.last()
		flCheckStatus(t, p, in, f.Applied, f.DeadLettered, losses, epoch, end)
	}
}

// flModelName is the model's name of the epoch stored as name (name itself
// when the model has no such epoch).
func flModelName(in *flInput, name string) string {
	if e := in.epochOf(name); e != nil {
		return e.epoch
	}
	return name
}

// flParse reads data as the ledger does: the position after each line,
// valid or malformed, and the balances of the valid ones.
func flParse(data []byte) ledgerFile {
	lf := ledgerFile{balances: map[string]int64{}}
	for pos := 0; pos < len(data); {
		i := bytes.IndexByte(data[pos:], '\n')
		line := bytes.TrimSuffix(data[pos:pos+i], []byte("\r"))
		pos += i + 1
		if e, err := ledger.Parse(line); err == nil {
			lf.valid = append(lf.valid, int64(pos))
			lf.balances[e.Account] += e.Amount
		} else {
			lf.malformed = append(lf.malformed, int64(pos))
		}
	}
	return lf
}

// flCheckRows checks the outbox holds one row per line: the output of each
// valid one on ledger.out, the dead letter of each malformed one on
// ledger.dlq, by epoch and position, each epoch under one name, and nothing
// else.
func flCheckRows(t *testing.T, s *outbox.Store, in *flInput, want map[*flEpoch][2][]int64) {
	t.Helper()
	dir := filepath.Dir(in.path)
	got := map[*flEpoch][2][]int64{}
	names := map[*flEpoch]string{}
	for after := int64(0); ; {
		rows, err := s.Rows(context.Background(), after, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			if r.Feed != "ledger" || r.N != 0 || r.Partition != 0 {
				t.Fatalf("row %+v: want feed ledger, partition 0, n 0", r)
			}
			e := in.epochOf(r.Epoch)
			switch {
			case e == nil:
				t.Fatalf("row at %d of epoch %s (%s), which the input never had; the input's files: %s",
					r.Position, r.Epoch, flFileOf(dir, r.Epoch), flFiles(dir))
			case names[e] == "":
				names[e] = r.Epoch
			case names[e] != r.Epoch:
				t.Fatalf("the lines of epoch %s are under two names, %s and %s", e.epoch, names[e], r.Epoch)
			}
			g := got[e]
			switch r.Topic {
			case "ledger.out":
				g[0] = append(g[0], r.Position)
			case "ledger.dlq":
				g[1] = append(g[1], r.Position)
			default:
				t.Fatalf("row on topic %q", r.Topic)
			}
			got[e] = g
			after = r.ID
		}
	}
	for e, w := range want {
		flCheckPositions(t, "ledger.out of "+e.epoch, got[e][0], w[0])
		flCheckPositions(t, "ledger.dlq of "+e.epoch, got[e][1], w[1])
	}
}

// flFileOf names the file in dir on the inode of epoch.
func flFileOf(dir, epoch string) string {
	for _, f := range flFileList(dir) {
		if strings.HasPrefix(epoch, f[1]+":") {
			return f[0]
		}
	}
	return "no file"
}

// flFiles lists the files in dir with their device and inode, and sizes.
func flFiles(dir string) string {
	var b strings.Builder
	for _, f := range flFileList(dir) {
		fmt.Fprintf(&b, "%s (%s, %s bytes) ", f[0], f[1], f[2])
	}
	return b.String()
}

func flFileList(dir string) [][3]string {
	entries, _ := os.ReadDir(dir)
	var out [][3]string
	for _, e := range entries {
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		out = append(out, [3]string{e.Name(), fmt.Sprintf("%d:%d", st.Dev, st.Ino), strconv.FormatInt(fi.Size(), 10)})
	}
	return out
}

// flCheckPositions wants got to be exactly want, and says how it differs.
func flCheckPositions(t *testing.T, what string, got, want []int64) {
	t.Helper()
	got = slices.Sorted(slices.Values(got))
	if slices.Equal(got, want) {
		return
	}
	var extra, missing []int64
	for _, p := range got {
		if _, found := slices.BinarySearch(want, p); !found {
			extra = append(extra, p)
		}
	}
	for _, p := range want {
		if _, found := slices.BinarySearch(got, p); !found {
			missing = append(missing, p)
		}
	}
	dup := len(got) - len(slices.Compact(slices.Clone(got)))
	t.Fatalf("%s: %d rows, want %d; %d repeated; not wanted %v; missing %v", what, len(got), len(want), dup,
		extra[:min(len(extra), 10)], missing[:min(len(missing), 10)])
}

// flCheckDeadLetters checks the stored dead letters are the malformed
// lines, by epoch and position, each for reason malformed.
func flCheckDeadLetters(t *testing.T, s *outbox.Store, in *flInput, want map[*flEpoch][2][]int64, n int) {
	t.Helper()
	dls, err := s.DeadLetters(context.Background(), "ledger", 0, n+10)
	if err != nil {
		t.Fatal(err)
	}
	got := map[*flEpoch][]int64{}
	for _, d := range dls {
		e := in.epochOf(d.Epoch)
		if d.Reason != "malformed" || e == nil {
			t.Fatalf("dead letter %+v: want reason malformed, an epoch of the input", d)
		}
		got[e] = append(got[e], d.Position)
	}
	for e, w := range want {
		flCheckPositions(t, "dead letters of "+e.epoch, got[e], w[1])
	}
	if len(dls) != n {
		t.Fatalf("%d dead letters, want %d", len(dls), n)
	}
}

// flCheckStatus checks GET /feeds/ledger/status of p against the expected
// figures: counters, the loss list, and where the feed stands.
func flCheckStatus(t *testing.T, p *proc, in *flInput, applied, dead int64, losses []flLoss, epoch *flEpoch, end int64) {
	t.Helper()
	m := regexp.MustCompile(`HTTP API listening.* addr=(\S+)`).FindStringSubmatch(p.log.String())
	if m == nil {
		t.Fatal("the server's log names no HTTP address")
	}
	wait(t, 15*time.Second, func() error {
		resp, err := http.Get("http://" + m[1] + "/feeds/ledger/status")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var st api.FeedStatus
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return fmt.Errorf("status %s: %w", resp.Status, err)
		}
		var got []flLoss
		for _, l := range st.Losses {
			to := int64(-1) // "extent": "unknown"
			if l.To != nil {
				to = *l.To
			}
			if (l.To == nil) != (l.Extent == "unknown") {
				return fmt.Errorf("loss %+v: to and extent disagree", l)
			}
			got = append(got, flLoss{l.Reason, flModelName(in, l.Epoch), l.From, to})
		}
		switch {
		case st.Applied != applied || st.DeadLettered != dead || st.Kind != ingest.KindFile:
			return fmt.Errorf("status applied %d, deadLettered %d, kind %s; want %d, %d, file", st.Applied, st.DeadLettered, st.Kind, applied, dead)
		case st.Lossless != (len(losses) == 0) || !slices.Equal(got, losses):
			return fmt.Errorf("status lossless %v, losses %+v; want %+v", st.Lossless, got, losses)
		case !epoch.named(st.Epoch) || st.Position != end:
			return fmt.Errorf("status at %s@%d, want %s@%d", st.Epoch, st.Position, epoch.epoch, end)
		}
		return nil
	})
}

// flPause stops the server with SIGSTOP and waits until every thread of it
// has stopped: the signal takes effect some time after kill(2) returns, and
// a test that goes on at once races the process it means to pause.
func flPause(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	tasks := fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid)
	wait(t, 10*time.Second, func() error {
		entries, err := os.ReadDir(tasks)
		if err != nil {
			return err
		}
		for _, e := range entries {
			stat, err := os.ReadFile(filepath.Join(tasks, e.Name(), "stat"))
			if err != nil {
				return err
			}
			// The state follows the command name in parentheses.
			i := bytes.LastIndexByte(stat, ')')
			if i < 0 || i+2 >= len(stat) || (stat[i+2] != 'T' && stat[i+2] != 't') {
				return fmt.Errorf("thread %s not stopped yet", e.Name())
			}
		}
		return nil
	})
}

// flResume lets the paused server go on with SIGCONT.
func flResume(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// flStart starts the server on in and waits until it runs.
func flStart(t *testing.T, db string, in *flInput) *proc {
	t.Helper()
	p := start(t, nil, flArgs(db, in)...)
	waitRunning(t, p)
	return p
}

// flCaughtUp waits until the server has applied all of in.
func flCaughtUp(t *testing.T, db string, in *flInput) {
	t.Helper()
	e, end := in.last()
	flWaitAt(t, db, e, end)
}

// envSeed names the variable that replays a run: its seed, as a failed run
// logged it. The storm also depends on timing, so a seed alone may not
// bring back a failure; it does bring back the same sequence of writes,
// rotations and kill moments.
const envSeed = "OUTBOXD_TEST_SEED"

// flRand returns the test's random source, seeded from OUTBOXD_TEST_SEED
// when set, else from the clock; the seed is logged either way.
func flRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, v, err)
		}
		seed = s
	}
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 10))
}

// TestFileLifecycle_RotationsWhileDown rotates the input several times while
// the server is stopped (numbered generations, after a SIGTERM) and killed
// (dated generations, after a kill -9): every generation is read once, in
// order, nothing lost.
func TestFileLifecycle_RotationsWhileDown(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	in.write(500)
	p := flStart(t, db, in)
	flCaughtUp(t, db, in)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	in.write(300) // after the last checkpoint: unread
	in.rotate()
	in.write(400)
	in.rotate()
	in.write(200)
	in.rotate()
	in.write(100)
	p = flStart(t, db, in)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, nil, p)

	p.kill()
	in.write(150)
	in.rename("-20261201")
	in.write(250)
	in.rename("-20261202")
	in.write(50)
	p = flStart(t, db, in)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, nil, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestFileLifecycle_RotationsWhilePaused rotates the input several times
// while the server is stopped with SIGSTOP, then lets it go on.
func TestFileLifecycle_RotationsWhilePaused(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	in.write(500)
	p := flStart(t, db, in)
	flCaughtUp(t, db, in)
	flPause(t, p)
	in.write(200)
	in.rename(".2026-12-01")
	in.write(300)
	in.rename(".2026-12-02")
	in.write(100)
	in.rename(".2026-12-03")
	in.write(80)
	flResume(t, p)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, nil, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestFileLifecycle_RotationsWhileRunning rotates the input in quick
// succession while the server reads it, so that several rotations fall
// between two of its looks.
func TestFileLifecycle_RotationsWhileRunning(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	in.write(200)
	p := flStart(t, db, in)
	// Up is not opened: a new feed starts at the file then at the path,
	// and rotations before it opens it are no rotations the feed follows.
	flCaughtUp(t, db, in)
	for range 15 {
		in.write(50 + rng.IntN(400))
		in.rotate()
	}
	in.write(100)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, nil, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestFileLifecycle_CopyTruncateWhileDown copies and truncates the input
// while the server is stopped: the rest of the old epoch is read from the
// copy, the truncated file from 0 in a new epoch. Then once without a
// copy: the loss is recorded, of unknown extent.
func TestFileLifecycle_CopyTruncateWhileDown(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	in.write(500)
	p := flStart(t, db, in)
	flCaughtUp(t, db, in)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	in.write(300) // unread: only the copy keeps it
	in.copyTruncate(true, 0)
	in.write(200) // regrown
	p = flStart(t, db, in)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, nil, p)

	p.kill()
	epoch, pos := in.last()
	in.write(100) // lost: truncated with no copy
	in.copyTruncate(false, pos)
	in.write(60)
	p = flStart(t, db, in)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, []flLoss{{filefeed.LossUnseenTruncated, epoch.epoch, pos, ingest.UnknownPosition}}, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestFileLifecycle_CopyTruncateWhilePaused copies and truncates the input
// while the server is stopped with SIGSTOP; then once without a copy.
func TestFileLifecycle_CopyTruncateWhilePaused(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	in.write(500)
	p := flStart(t, db, in)
	flCaughtUp(t, db, in)
	flPause(t, p)
	in.write(300)
	in.copyTruncate(true, 0)
	in.write(200)
	flResume(t, p)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, nil, p)

	flPause(t, p)
	epoch, pos := in.last()
	in.write(100) // never seen: the server is paused
	in.copyTruncate(false, pos)
	in.write(60)
	flResume(t, p)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, []flLoss{{filefeed.LossUnseenTruncated, epoch.epoch, pos, ingest.UnknownPosition}}, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestFileLifecycle_KillNineRotationStorm rotates the input (numbered
// renames, now and then a copytruncate) while the server is killed with
// SIGKILL at random moments and started again; the end is exact.
func TestFileLifecycle_KillNineRotationStorm(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	writerRng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
	in.rng = writerRng
	failed := make(chan error, 1)
	in.fail = func(err error) { failed <- err; runtime.Goexit() }
	// A new feed starts at the file at the path: the first server must have
	// it before the storm rotates it away.
	in.write(100)
	p := start(t, nil, flArgs(db, in)...)
	flCaughtUp(t, db, in)
	p.kill()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 25 {
			// A burst of rotations back to back, so that several fall
			// while the server is down or between two of its looks.
			for range 1 + writerRng.IntN(4) {
				in.write(20 + writerRng.IntN(200))
				if writerRng.IntN(4) == 0 {
					in.copyTruncate(true, 0)
				} else {
					in.rotate()
				}
			}
			in.write(20 + writerRng.IntN(200))
			time.Sleep(time.Duration(20+writerRng.IntN(60)) * time.Millisecond) // pacing the writer, not a wait
		}
		in.write(100)
	}()
	var runs []*proc
	t.Cleanup(func() { flStormLogs(t, in, runs) })
	kills := 0
	for writing := true; writing; {
		p := start(t, nil, flArgs(db, in)...)
		runs = append(runs, p)
		time.Sleep(time.Duration(30+rng.IntN(300)) * time.Millisecond) // a random moment to crash at
		p.kill()
		kills++
		select {
		case <-done:
			writing = false
		default:
		}
	}
	select {
	case err := <-failed:
		t.Fatal(err)
	default:
	}
	t.Logf("%d kill -9s, %d epochs", kills, len(in.epochs))
	p = flStart(t, db, in)
	runs = append(runs, p)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, nil, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// flStormLogLines are the log lines that tell how the feed moved through
// the files of a storm.
var flStormLogLines = regexp.MustCompile(`file rotated|file feed epoch|new epoch|resuming|truncated|copy|lost|generation|inode|gone`)

// flStormLogs logs, when the test failed, the model's epochs and the lines
// of every run's log that tell how the feed moved through the files: a
// storm's failure is made of several runs, and the last one alone rarely
// shows it.
func flStormLogs(t *testing.T, in *flInput, runs []*proc) {
	if !t.Failed() {
		return
	}
	var b strings.Builder
	for i, e := range in.epochs {
		fmt.Fprintf(&b, "epoch %d: %s on %v, %d bytes\n", i, e.epoch, e.inodes, len(e.data))
	}
	for i, p := range runs {
		fmt.Fprintf(&b, "run %d:\n", i)
		for _, line := range strings.Split(p.log.String(), "\n") {
			if flStormLogLines.MatchString(line) {
				b.WriteString(line + "\n")
			}
		}
	}
	t.Logf("the storm's epochs and runs:\n%s", b.String())
}
