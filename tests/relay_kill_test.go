package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/ingest/ledger"
)

// killRun appends lf to a file while a server ingests and relays it to
// broker, killing the server with SIGKILL `kills` times at random moments;
// then it lets a last server finish and stops it.
func killRun(t *testing.T, rng *rand.Rand, lf ledgerFile, kills int, extra ...string) (db string) {
	t.Helper()
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db = killDB(t, dir)
	args := append([]string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--http", "127.0.0.1:0"}, extra...)
	writing := appendSlowly(t, input, lf.data, 8*time.Second, rng)
	for range kills {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(30+rng.IntN(400)) * time.Millisecond) // a random moment to crash at
		p.kill()
	}
	<-writing
	p := start(t, nil, args...)
	waitPublished(t, db, int64(len(lf.data)))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	return db
}

// waitPublished waits until the feed has stored position end and the relay
// has published every outbox row.
func waitPublished(t *testing.T, db string, end int64) {
	t.Helper()
	s := readStore(t, db)
	ctx := context.Background()
	wait(t, 90*time.Second, func() error {
		cps, err := s.ReadPositions(ctx, "ledger")
		if err != nil || len(cps) == 0 || cps[0].Position != end {
			return fmt.Errorf("stored position %v (%v), want %d", cps, err, end)
		}
		return relayDone(ctx, s)
	})
}

// checkTopics checks ledger.out and ledger.dlq hold one record per line:
// every valid line's output once, every malformed line once, balances in
// order per account. dup says how many extra copies (same outboxd-id) are
// allowed in all; it returns how many there were.
func checkTopics(t *testing.T, broker string, lf ledgerFile, dup int) int {
	t.Helper()
	return checkTopicsWith(t, broker, nil, lf, dup)
}

// checkTopicsWith is checkTopics with the clients' options (TLS, SASL).
func checkTopicsWith(t *testing.T, broker string, opts []kgo.Opt, lf ledgerFile, dup int) int {
	t.Helper()
	got := readAllWith(t, broker, opts, "ledger.out", "ledger.dlq")
	repeats := 0
	out := dedupe(t, got["ledger.out"], &repeats)
	dlq := dedupe(t, got["ledger.dlq"], &repeats)
	if repeats > dup {
		t.Fatalf("%d repeated records, want at most %d", repeats, dup)
	}
	var outPos, dlqPos []int64
	for _, c := range out {
		outPos = append(outPos, atoi64(c.Headers["outboxd-position"]))
	}
	for _, c := range dlq {
		if c.Headers["outboxd-reason"] != "malformed" {
			t.Fatalf("dead letter %+v: reason %q", c, c.Headers["outboxd-reason"])
		}
		dlqPos = append(dlqPos, atoi64(c.Headers["outboxd-position"]))
	}
	checkPositions(t, "ledger.out", outPos, lf.valid)
	checkPositions(t, "ledger.dlq", dlqPos, lf.malformed)
	checkBalances(t, out, lf)
	return repeats
}

// dedupe drops records whose outboxd-id was seen, counting them; every
// record must carry the outboxd headers.
func dedupe(t *testing.T, cs []consumed, repeats *int) []consumed {
	t.Helper()
	seen := map[string]bool{}
	var out []consumed
	for _, c := range cs {
		id := c.Headers["outboxd-id"]
		if id == "" || c.Headers["outboxd-feed"] != "ledger" || c.Headers["outboxd-epoch"] == "" || c.Headers["outboxd-position"] == "" {
			t.Fatalf("record %+v lacks the outboxd headers", c)
		}
		if seen[id] {
			*repeats++
			continue
		}
		seen[id] = true
		out = append(out, c)
	}
	return out
}

// checkBalances replays the file per account and checks each account's
// outputs, in partition order, carry the running balance.
func checkBalances(t *testing.T, out []consumed, lf ledgerFile) {
	t.Helper()
	byAcct := map[string][]ledger.Output{}
	for _, c := range out {
		var o ledger.Output
		if err := json.Unmarshal([]byte(c.Value), &o); err != nil {
			t.Fatalf("output %q: %v", c.Value, err)
		}
		if o.Account != c.Key {
			t.Fatalf("output %+v keyed %q", o, c.Key)
		}
		byAcct[o.Account] = append(byAcct[o.Account], o)
	}
	for acct, os := range byAcct {
		var bal int64
		for i, o := range os {
			if i > 0 && o.Position <= os[i-1].Position {
				t.Fatalf("%s: output at %d after %d: out of order", acct, o.Position, os[i-1].Position)
			}
			bal += o.Amount
			if o.Balance != bal {
				t.Fatalf("%s: balance %d at position %d, want %d", acct, o.Balance, o.Position, bal)
			}
		}
		if bal != lf.balances[acct] {
			t.Fatalf("%s: final balance %d, want %d", acct, bal, lf.balances[acct])
		}
	}
}

func TestRelay_KillNine(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	lf := makeLedger(rng, 100_000)

	t.Run("ExactlyOnce", func(t *testing.T) {
		broker := startBroker(t)
		killRun(t, rng, lf, 30, "--brokers", broker, "--outbox-retention", "0")
		checkTopics(t, broker, lf, 0)
	})

	t.Run("AtLeastOnce", func(t *testing.T) {
		broker := startBroker(t)
		const kills, batch = 30, 1000
		killRun(t, rng, lf, kills, "--brokers", broker, "--relay", "at-least-once", "--relay-batch", fmt.Sprint(batch))
		repeats := checkTopics(t, broker, lf, kills*batch)
		t.Logf("at-least-once: %d repeated records after %d kills", repeats, kills)
	})
}
