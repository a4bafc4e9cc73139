package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/recording"
)

// sqlReplayJSON is the part of `server replay --json` this test reads.
type sqlReplayJSON struct {
	Verdict   string `json:"verdict"`
	Processor struct {
		Fingerprint, RecordedFingerprint, Kind string
	} `json:"processor"`
	Replay struct {
		Items, Applied, DeadLettered, ReplaysSkipped, DecisionsDiffering int64
	} `json:"replay"`
	Diff *recording.DiffResult `json:"diff"`
}

func runSQLReplay(t *testing.T, args ...string) (sqlReplayJSON, int) {
	t.Helper()
	cmd := exec.Command(serverBin, append(append([]string{"replay"}, args...), "--json")...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	var rep sqlReplayJSON
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("server replay %v: exit %d, stderr %q: %v", args, cmd.ProcessState.ExitCode(), stderr.String(), jerr)
	}
	return rep, cmd.ProcessState.ExitCode()
}

// TestSQLLedger_RecordReplayChanged records examples/ledger.yaml's SQL
// ledger while its file is appended to, killing the server with SIGKILL
// at random moments, then replays the recordings: identical to the live
// database (exit 0), and to what the recorded definition makes of them.
// Then a changed SQL (amounts divisible by 7 refused) replays with
// --config new.yaml --diff: exactly the deliveries and balances the
// change touches are listed, each with both sides, and nothing else.
func TestSQLLedger_RecordReplayChanged(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 26))
	dir := t.TempDir()
	input, db, rec := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "live.db"), filepath.Join(dir, "rec")
	lf := makeLedger(rng, 20_000)
	args := []string{"--config", example("ledger.yaml"), "--db", db, "--feed", "ledger=file:" + input,
		"--relay", "none", "--http", "127.0.0.1:0", "--record", rec}

	writing := appendSlowly(t, input, lf.data, 3*time.Second, rng)
	kills := 0
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
	end := int64(len(lf.data))
	p := start(t, nil, args...)
	wait(t, 90*time.Second, func() error {
		if pos := storedPosition(t, db, "ledger"); pos != end {
			return fmt.Errorf("stored position %d, want %d", pos, end)
		}
		return nil
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	runs, _ := filepath.Glob(filepath.Join(rec, "*.rec"))
	t.Logf("%d kill -9s, %d recordings", kills, len(runs))
	lines := int64(len(lf.valid) + len(lf.malformed))

	for _, extra := range [][]string{{"--diff", db}, {"--config", example("ledger.yaml"), "--diff"}} {
		rep, code := runSQLReplay(t, append([]string{rec}, extra...)...)
		r, d := rep.Replay, rep.Diff
		if code != 0 || rep.Verdict != "identical" || rep.Processor.Kind != "sql" || rep.Processor.Fingerprint != rep.Processor.RecordedFingerprint ||
			r.Items != lines || r.Applied != int64(len(lf.valid)) || r.DeadLettered != int64(len(lf.malformed)) || r.DecisionsDiffering != 0 ||
			d.Deliveries != lines || d.Divergent != 0 || d.DivergentTables != 0 || len(d.Divergences) != 0 {
			t.Fatalf("replay %v: exit %d, verdict %s, replay %+v, diff %+v", extra, code, rep.Verdict, r, d)
		}
	}

	// The new version refuses amounts divisible by 7.
	b, err := os.ReadFile(example("ledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const rule = "OR typeof(:amount) <> 'integer'"
	if !strings.Contains(string(b), rule) {
		t.Fatalf("examples/ledger.yaml has no %q", rule)
	}
	changed := filepath.Join(dir, "new.yaml")
	os.WriteFile(changed, []byte(strings.Replace(string(b), rule, rule+" OR :amount % 7 = 0", 1)), 0o644)
	want := changedLedger(t, lf)
	rep, code := runSQLReplay(t, rec, "--config", changed, "--diff", "--diff-keys", "1000000")
	d := rep.Diff
	if code != 1 || rep.Verdict != "divergent" || rep.Processor.Fingerprint == rep.Processor.RecordedFingerprint ||
		rep.Replay.DecisionsDiffering != int64(want.refused) || d.Deliveries != lines || d.Divergent != int64(len(want.positions)) ||
		d.Unlisted != 0 || d.DivergentTables != 1 {
		t.Fatalf("exit %d, verdict %s, replay %+v, diff: %d of %d deliveries, %d tables, unlisted %d; want 1, %d refused, %d divergent",
			code, rep.Verdict, rep.Replay, d.Divergent, d.Deliveries, d.DivergentTables, d.Unlisted, want.refused, len(want.positions))
	}
	var got []int64
	for _, dv := range d.Divergences {
		got = append(got, dv.Position)
	}
	if !slices.Equal(got, want.positions) {
		t.Fatalf("divergent positions: %d listed, want %d; first difference at %d", len(got), len(want.positions), firstDiff(got, want.positions))
	}
	if d.Topics["ledger.dlq"] != int64(want.refused) || d.Topics["ledger.out"] != int64(len(want.positions)) || len(d.Topics) != 2 {
		t.Fatalf("by topic %v, want ledger.dlq %d, ledger.out %d", d.Topics, want.refused, len(want.positions))
	}
	var tb recording.TableDiff
	for _, x := range d.Tables {
		if x.Table == "balances" {
			tb = x
		} else if !x.Same() {
			t.Fatalf("table %s differs: %+v", x.Table, x)
		}
	}
	if tb.Differing != int64(len(want.rows))-tb.OnlyDatabase || tb.OnlyReplayed != 0 || tb.Unlisted != 0 || !reflect.DeepEqual(tb.Rows, want.rows) {
		t.Fatalf("balances: %d differ, %d only in the baseline, rows\n%v\nwant\n%v", tb.Differing, tb.OnlyDatabase, tb.Rows, want.rows)
	}
	t.Logf("%d lines: %d refused by the new SQL, %d deliveries and %d balances differ, each listed", lines, want.refused, len(want.positions), len(want.rows))
}

// changed is what the diff of the changed ledger must list.
type changed struct {
	refused   int
	positions []int64
	rows      []recording.RowDiff
}

// changedLedger computes, from the file, which deliveries and balances
// the ledger that refuses amounts divisible by 7 makes differently: a
// refused line (a dead letter instead of an output), and every later
// output of its account whose balance the refusals changed.
func changedLedger(t *testing.T, lf ledgerFile) changed {
	t.Helper()
	var c changed
	old, now := map[string]int64{}, map[string]int64{}
	applied := map[string]bool{}
	pos := int64(0)
	for _, line := range strings.SplitAfter(string(lf.data), "\n") {
		if line == "" {
			continue
		}
		pos += int64(len(line))
		e, err := ledger.Parse([]byte(strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")))
		if err != nil {
			continue
		}
		old[e.Account] += e.Amount
		if e.Amount%7 == 0 {
			c.refused++
			c.positions = append(c.positions, pos)
			continue
		}
		now[e.Account] += e.Amount
		applied[e.Account] = true
		if old[e.Account] != now[e.Account] {
			c.positions = append(c.positions, pos)
		}
	}
	for _, a := range slices.Sorted(mapsKeys(old)) {
		key := fmt.Sprintf("account=%q", a)
		exp := fmt.Sprintf("%s, balance=%d", key, old[a])
		switch {
		case !applied[a]:
			c.rows = append(c.rows, recording.RowDiff{Key: key, Expected: exp})
		case old[a] != now[a]:
			c.rows = append(c.rows, recording.RowDiff{Key: key, Expected: exp, Got: fmt.Sprintf("%s, balance=%d", key, now[a])})
		}
	}
	return c
}

func mapsKeys(m map[string]int64) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
