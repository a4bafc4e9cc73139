package tests

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// snapshotsIn lists the snapshot files in dir.
func snapshotsIn(t *testing.T, dir string) map[string]bool {
	t.Helper()
	m := map[string]bool{}
	found, err := filepath.Glob(filepath.Join(dir, "*.snapshot.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		m[filepath.Base(f)] = true
	}
	return m
}

// filesIn lists dir's files with their sizes.
func filesIn(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			m[e.Name()] = fi.Size()
		}
	}
	return m
}

func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// TestRecord_RetentionKillNine records a ledger feed across kill -9s at
// random moments, first with a snapshot every run and a total cap that
// makes retention remove the oldest runs, then with snapshots reused
// across restarts, far from the cap and then under it: after each phase,
// what is left of the recordings replays identical to the live database
// (outputs, balances, positions), and under the cap it holds no more
// than the cap and the commit that crossed it, with nothing unfinished
// left behind.
func TestRecord_RetentionKillNine(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 61))
	dir := t.TempDir()
	input, db, rec := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "live.db"), filepath.Join(dir, "rec")
	// The cap holds a few snapshots of the live database (about 2.5 MB at
	// the end): a new run's snapshot is made room for under it, so a cap
	// near one snapshot would leave each phase's last run alone, with
	// nothing to replay.
	const capBytes = 6 << 20
	base := []string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--relay", "none", "--http", "127.0.0.1:0", "--record", rec, "--record-max-bytes", "65536"}
	capped := func(capBytes int, interval string) []string {
		return append(slices.Clone(base), "--record-max-total-bytes", fmt.Sprint(capBytes), "--record-snapshot-interval", interval)
	}
	// Over the cap by more than the commit that crossed it (the recorder
	// pauses after it) is a bug: each snapshot is made room for first.
	withinCap := func(name string) {
		t.Helper()
		if n := dirBytes(t, rec); n > capBytes+(1<<20) {
			t.Fatalf("%s: recordings hold %d bytes, far over the cap %d: %v", name, n, capBytes, filesIn(t, rec))
		}
		// What files killed while being created left is gone too: the
		// last start removed it, and the last stop left none.
		if files := filesIn(t, rec); strings.Contains(fmt.Sprint(files), ".tmp") {
			t.Fatalf("%s: unfinished files left: %v", name, files)
		}
	}
	all := 0
	phase := func(name string, lf ledgerFile, args []string) {
		t.Helper()
		all += len(lf.valid) + len(lf.malformed)
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
		st, err := os.Stat(input)
		if err != nil {
			t.Fatal(err)
		}
		p := start(t, nil, args...)
		base := apiAddr(t, p)
		wait(t, 90*time.Second, func() error {
			if pos := storedPosition(t, db, "ledger"); pos != st.Size() {
				return fmt.Errorf("stored position %d, want %d", pos, st.Size())
			}
			// A stop while the run's snapshot is taken leaves no run:
			// the last start records (or pauses at the cap) first.
			fs, err := getStatus(base, "ledger")
			if err != nil {
				return err
			}
			if r := fs.Recording; r == nil || (!r.Recording && r.Paused == "") || r.Error != "" {
				return fmt.Errorf("recording %+v: not recording yet", r)
			}
			return nil
		})
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Fatalf("%s: exit code %d after SIGTERM, want 0", name, code)
		}
		t.Logf("%s: %d kill -9s; recordings hold %d bytes", name, kills, dirBytes(t, rec))
	}
	check := func(name string) replayJSON {
		t.Helper()
		rep, code := runReplay(t, rec, "--db", filepath.Join(t.TempDir(), "out.db"), "--diff", db)
		r, d := rep.Replay, rep.Diff
		if code != 0 || rep.Verdict != "identical" || r.Items == 0 || r.Items > int64(all) || r.DecisionsDiffering != 0 ||
			d.Deliveries != r.Applied+r.DeadLettered || d.Positions != "" || d.DivergentTables != 0 || len(r.Unconfirmed) != 0 {
			t.Fatalf("%s: replay exit %d, verdict %s, replay %+v, diff %+v", name, code, rep.Verdict, r, d)
		}
		t.Logf("%s: %d recordings replay identical: %d items of %d", name, len(rep.Files), r.Items, all)
		return rep
	}

	phase("a snapshot every run", makeLedger(rng, 30_000), capped(capBytes, "0"))
	repA := check("a snapshot every run")
	if r := repA.Replay; r.Items >= int64(all) {
		t.Fatalf("retention removed nothing: the replay holds every item (%d); cap %d bytes", r.Items, capBytes)
	}
	withinCap("a snapshot every run")
	before := snapshotsIn(t, rec)

	// Far from any cap, every restart records from the last snapshot.
	phase("snapshots reused", makeLedger(rng, 5_000), capped(64<<20, "1h"))
	for s := range snapshotsIn(t, rec) {
		if !before[s] {
			t.Fatalf("a restart took snapshot %s; want the last one reused (before: %v)", s, before)
		}
	}
	check("snapshots reused")

	// Snapshots reused under the cap: the generation recorded from grows
	// until the recorder pauses; the next start takes a snapshot, made
	// room for.
	phase("snapshots reused under the cap", makeLedger(rng, 15_000), capped(capBytes, "1h"))
	check("snapshots reused under the cap")
	withinCap("snapshots reused under the cap")
}
