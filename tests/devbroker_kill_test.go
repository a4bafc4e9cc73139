package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// TestDevBroker_KillNine is a new user's first kill test: the default
// in-process dev broker (its log in devbroker/ beside the database) dies
// with the server at every kill -9, in the middle of the relay's
// transactions; a read_committed reader must still see every output once.
func TestDevBroker_KillNine(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	lf := makeLedger(rng, 40_000)
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db := filepath.Join(dir, "data", "outboxd.db")
	broker := "127.0.0.1:" + freePort(t)
	args := []string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--http", "127.0.0.1:0", "--dev-broker-addr", broker, "--outbox-retention", "0"}

	const kills = 20
	writing := appendSlowly(t, input, lf.data, 10*time.Second, rng)
	var progress int64
	for i := range kills {
		p := start(t, nil, args...)
		progress = waitRelayMoves(t, p, db, progress)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // a random moment of publishing to crash at
		p.kill()
		t.Logf("kill %d: relay progress was past %d", i+1, progress)
	}
	<-writing
	p := start(t, nil, args...)
	waitPublished(t, db, int64(len(lf.data)))
	checkTopics(t, broker, lf, 0)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// waitRelayMoves waits until the relay of the running server p has
// published past since, and returns its progress.
func waitRelayMoves(t *testing.T, p *proc, db string, since int64) int64 {
	t.Helper()
	var now int64
	wait(t, 60*time.Second, func() error {
		select {
		case <-p.done:
			t.Fatalf("the server exited: %v", p.err)
		default:
		}
		if _, err := os.Stat(db); err != nil {
			return err // not created yet: opening it here would create it
		}
		s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
		if err != nil {
			return err
		}
		defer s.Close()
		ctx := context.Background()
		id, err := s.MetaID(ctx, "relay_id")
		if err != nil {
			return err
		}
		if now, err = s.RelayProgress(ctx, id); err != nil {
			return err
		}
		if now <= since {
			return fmt.Errorf("relay progress %d, not past %d yet", now, since)
		}
		return nil
	})
	return now
}

// TestDevBroker_QuietLog: at 20 lines a second the dev broker logs nothing
// at WARN or above (its slow-EndTxn notes and client timings are no
// operator's business).
func TestDevBroker_QuietLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 28))
	lf := makeLedger(rng, 200)
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db := filepath.Join(dir, "data", "outboxd.db")
	p := start(t, nil, "--db", db, "--feed", "ledger=file:"+input, "--processor", "ledger=ledger",
		"--http", "127.0.0.1:0", "--dev-broker-addr", "127.0.0.1:"+freePort(t))
	f, err := os.OpenFile(input, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for line := range strings.Lines(string(lf.data)) {
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // pacing the writer at 20 lines a second
	}
	waitPublished(t, db, int64(len(lf.data)))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	var loud []string
	for line := range strings.Lines(p.log.String()) {
		if strings.Contains(line, "component=devbroker") && (strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) {
			loud = append(loud, line)
		}
	}
	if len(loud) > 0 {
		t.Fatalf("%d dev broker lines at WARN or above, e.g. %s", len(loud), loud[0])
	}
}
