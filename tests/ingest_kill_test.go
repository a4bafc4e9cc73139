package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/testseam"
	"github.com/outboxd/outboxd/outbox"
)

// ledgerFile is a ledger input and what applying it exactly once must give.
type ledgerFile struct {
	data      []byte
	valid     []int64 // positions after each valid line
	malformed []int64 // positions after each malformed line
	balances  map[string]int64
	amounts   []int64 // amount of each valid line, in order
}

// makeLedger builds n lines over a few accounts; about one in 400 is
// malformed, in each of the ways the ledger refuses, and so is the line at
// n/2.
func makeLedger(rng *rand.Rand, n int) ledgerFile { return makeLedgerOver(rng, n, 200) }

// makeLedgerOver is makeLedger over the given number of accounts.
func makeLedgerOver(rng *rand.Rand, n, accounts int) ledgerFile {
	bad := []string{"no comma here", ",5", "acct-x,", "acct-y,12z", "acct-z,99999999999999999999", "\r"}
	lf := ledgerFile{balances: map[string]int64{}}
	var b strings.Builder
	for i := range n {
		var line string
		// About one line in 400 is malformed, and always the middle one,
		// so every file has a dead letter (and its topic) to check.
		if rng.IntN(400) == 0 || i == n/2 {
			line = bad[rng.IntN(len(bad))]
		} else {
			acct := fmt.Sprintf("acct-%03d", rng.IntN(accounts))
			amt := rng.Int64N(2001) - 1000
			line = fmt.Sprintf("%s,%d", acct, amt)
			if i%7 == 0 {
				line += "\r" // CRLF lines are read the same
			}
		}
		b.WriteString(line)
		b.WriteByte('\n')
		pos := int64(b.Len())
		if e, err := ledger.Parse([]byte(strings.TrimSuffix(line, "\r"))); err == nil {
			lf.valid = append(lf.valid, pos)
			lf.balances[e.Account] += e.Amount
			lf.amounts = append(lf.amounts, e.Amount)
		} else {
			lf.malformed = append(lf.malformed, pos)
		}
	}
	lf.data = []byte(b.String())
	return lf
}

// appendSlowly writes data to path in chunks of random size (cutting lines
// anywhere), pacing the writes over about d.
func appendSlowly(t *testing.T, path string, data []byte, d time.Duration, rng *rand.Rand) <-chan struct{} {
	done := make(chan struct{})
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	chunks := 200
	pause := d / time.Duration(chunks)
	avg := len(data) / chunks
	rng = rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())) // the writer's own: the caller goes on using rng
	go func() {
		defer close(done)
		defer f.Close()
		for len(data) > 0 {
			n := min(len(data), 1+rng.IntN(2*avg))
			if _, err := f.Write(data[:n]); err != nil {
				t.Error(err)
				return
			}
			data = data[n:]
			time.Sleep(pause) // pacing the writer, not waiting for a condition
		}
	}()
	return done
}

func TestIngest_KillNine(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db := killDB(t, dir)
	lf := makeLedger(rng, 100_000)
	args := []string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--relay", "none", "--http", "127.0.0.1:0"}

	t0 := time.Now()
	writing := appendSlowly(t, input, lf.data, 6*time.Second, rng)
	kills := 0
	for kills < 25 {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(20+rng.IntN(300)) * time.Millisecond) // a random moment to crash at
		p.kill()
		kills++
	}
	t.Logf("%d kill -9s (%v)", kills, time.Since(t0))
	<-writing
	t.Logf("%d bytes appended (%v)", len(lf.data), time.Since(t0))

	p := start(t, nil, args...)
	end := int64(len(lf.data))
	wait(t, 60*time.Second, func() error {
		if pos := storedPosition(t, db, "ledger"); pos != end {
			return fmt.Errorf("stored position %d, want %d", pos, end)
		}
		return nil
	})
	t.Logf("caught up (%v)", time.Since(t0))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	checkLedger(t, db, lf, 0)

	t.Run("ReplayIsSkipped", func(t *testing.T) {
		from := lf.valid[len(lf.valid)/2]
		redelivered := countAfter(lf, from)
		env := []string{"OUTBOXD_TEST_REWIND=ledger=" + itoa(from)}
		p := start(t, env, args...)
		s := readStore(t, db)
		wait(t, 60*time.Second, func() error {
			f, err := s.Feed(context.Background(), "ledger")
			if err != nil {
				return err
			}
			if f.ReplaysSkipped != int64(redelivered) {
				return fmt.Errorf("replaysSkipped %d, want %d", f.ReplaysSkipped, redelivered)
			}
			return nil
		})
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Fatalf("exit code %d, want 0", code)
		}
		checkLedger(t, db, lf, redelivered)
	})

	t.Run("WithoutGuardDoubleApplies", func(t *testing.T) {
		from := lf.valid[len(lf.valid)-100]
		// The guard's authority moved back: the shipped binary resumes at
		// from and applies the lines after it again.
		s := readStore(t, db)
		before, _ := s.Feed(context.Background(), "ledger")
		if err := testseam.MoveBack(context.Background(), s, "ledger", 0, from); err != nil {
			t.Fatal(err)
		}
		p := start(t, nil, args...)
		wantApplied := before.Applied + 99 // the last 99 valid lines, applied again
		wait(t, 60*time.Second, func() error {
			f, err := s.Feed(context.Background(), "ledger")
			if err != nil {
				return err
			}
			if f.Applied != wantApplied {
				return fmt.Errorf("applied %d, want %d", f.Applied, wantApplied)
			}
			return nil
		})
		p.stop(t, 30*time.Second)
		got, err := ledger.Balances(context.Background(), s, "ledger")
		if err != nil {
			t.Fatal(err)
		}
		if equalBalances(got, lf.balances) {
			t.Fatal("balances are still exact with the guard off: the replay test could not fail")
		}
	})
}

// TestIngest_KillNineManyAccounts kills the server at random moments
// while it applies lines over more accounts than a batch holds: each
// restart starts with no balance in memory, so every batch reads
// thousands of balances from SQLite (several reads of a chunk each) before
// its items. Every line must still be applied once, with the balance it
// had.
func TestIngest_KillNineManyAccounts(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db := killDB(t, dir)
	lf := makeLedgerOver(rng, 60_000, 20_000)
	args := []string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--relay", "none", "--http", "127.0.0.1:0"}
	writing := appendSlowly(t, input, lf.data, 4*time.Second, rng)
	for range 15 {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(20+rng.IntN(300)) * time.Millisecond) // a random moment to crash at
		p.kill()
	}
	<-writing
	p := start(t, nil, args...)
	end := int64(len(lf.data))
	wait(t, 60*time.Second, func() error {
		if pos := storedPosition(t, db, "ledger"); pos != end {
			return fmt.Errorf("stored position %d, want %d", pos, end)
		}
		return nil
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	checkLedger(t, db, lf, 0)
	checkRunningBalances(t, db)
}

// checkRunningBalances checks each output of ledger.out carries the sum
// of its account's amounts up to and including its line: a balance read
// wrong after a restart shows there, even when a later line hides it in
// the final balances.
func checkRunningBalances(t *testing.T, db string) {
	t.Helper()
	sums := map[string]int64{}
	for _, r := range allRows(t, readStore(t, db)) {
		if r.Topic != "ledger.out" {
			continue
		}
		var o ledger.Output
		if err := json.Unmarshal(r.Value, &o); err != nil {
			t.Fatalf("output %d: %v", r.ID, err)
		}
		sums[o.Account] += o.Amount
		if o.Balance != sums[o.Account] {
			t.Fatalf("output at position %d: balance %d of %s, want %d", r.Position, o.Balance, o.Account, sums[o.Account])
		}
	}
}

func countAfter(lf ledgerFile, pos int64) int {
	n := 0
	for _, p := range append(append([]int64{}, lf.valid...), lf.malformed...) {
		if p > pos {
			n++
		}
	}
	return n
}

func equalBalances(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// checkLedger checks the database holds exactly the effects of lf, applied
// once each.
func checkLedger(t *testing.T, db string, lf ledgerFile, replays int) {
	t.Helper()
	ctx := context.Background()
	s := readStore(t, db)
	got, err := ledger.Balances(ctx, s, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if !equalBalances(got, lf.balances) {
		t.Fatalf("balances differ from the file's sums:\n got %v\nwant %v", got, lf.balances)
	}
	f, err := s.Feed(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if f.Applied != int64(len(lf.valid)) || f.DeadLettered != int64(len(lf.malformed)) ||
		f.ReplaysSkipped != int64(replays) || !f.Lossless || f.CompletionFailures != 0 {
		t.Fatalf("stats %+v: want applied %d, deadLettered %d, replaysSkipped %d, lossless",
			f, len(lf.valid), len(lf.malformed), replays)
	}
	out, dlq := outboxPositions(t, s)
	checkPositions(t, "ledger.out", out, lf.valid)
	checkPositions(t, "ledger.dlq", dlq, lf.malformed)
	dls, err := s.DeadLetters(ctx, "ledger", 0, len(lf.malformed)+10)
	if err != nil {
		t.Fatal(err)
	}
	var dlPos []int64
	for _, d := range dls {
		if d.Reason != "malformed" {
			t.Fatalf("dead letter %+v: reason %q, want malformed", d, d.Reason)
		}
		dlPos = append(dlPos, d.Position)
	}
	checkPositions(t, "dead_letters", dlPos, lf.malformed)
	if ok, err := s.IntegrityCheck(ctx); err != nil || ok != "ok" {
		t.Fatalf("integrity_check = %q, %v", ok, err)
	}
}

// outboxPositions returns the positions of the outbox rows of each topic,
// checking each row is (feed, epoch, position, 0) of a single epoch.
func outboxPositions(t *testing.T, s *outbox.Store) (out, dlq []int64) {
	t.Helper()
	var after int64
	epochs := map[string]bool{}
	for {
		rows, err := s.Rows(context.Background(), after, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			epochs[r.Epoch] = true
			if r.Feed != "ledger" || r.N != 0 {
				t.Fatalf("row %+v: want feed ledger, n 0", r)
			}
			switch r.Topic {
			case "ledger.out":
				out = append(out, r.Position)
			case "ledger.dlq":
				dlq = append(dlq, r.Position)
			default:
				t.Fatalf("row on topic %q", r.Topic)
			}
			after = r.ID
		}
	}
	if len(epochs) != 1 {
		t.Fatalf("rows of %d epochs, want 1: %v", len(epochs), epochs)
	}
	return out, dlq
}

// checkPositions wants got to be exactly want: one each, none missing.
func checkPositions(t *testing.T, what string, got, want []int64) {
	t.Helper()
	sorted := append([]int64(nil), got...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	if len(sorted) != len(want) {
		t.Fatalf("%s: %d rows, want %d", what, len(sorted), len(want))
	}
	for i := range want {
		if sorted[i] != want[i] {
			t.Fatalf("%s: row %d at position %d, want %d (a gap or a duplicate)", what, i, sorted[i], want[i])
		}
	}
}
