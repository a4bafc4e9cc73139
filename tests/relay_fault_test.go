package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRelay_Faults runs the server's Kafka connections through a proxy the
// test controls: all connections cut for 5 s mid-stream, delayed, and cut
// again and again (some cuts land during CommitTxn). Nothing may be lost or
// doubled for a read_committed consumer, and the relay must recover alone.
func TestRelay_Faults(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	px := startProxiedBroker(t)
	lf := makeLedger(rng, 30_000)
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db := filepath.Join(dir, "outboxd.db")
	p := start(t, nil, "--db", db, "--feed", "ledger=file:"+input, "--processor", "ledger=ledger",
		"--brokers", px.Addr(), "--http", "127.0.0.1:0", "--relay-batch", "200")
	writing := appendSlowly(t, input, lf.data, 12*time.Second, rng)

	s := readStore(t, db)
	wait(t, 30*time.Second, func() error { // publishing has started: the faults hit a live stream
		id, err := s.MetaID(context.Background(), "relay_id")
		if err != nil {
			return err
		}
		if done, err := s.RelayProgress(context.Background(), id); err != nil || done == 0 {
			return fmt.Errorf("relay progress %d (%v), want some", done, err)
		}
		return nil
	})
	px.setDown(true)
	time.Sleep(5 * time.Second) // the outage itself
	px.setDown(false)

	px.setDelay(30 * time.Millisecond)
	time.Sleep(2 * time.Second) // a slow network for a while
	px.setDelay(0)

	for range 15 {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond) // random moments, some inside a commit
		px.cut()
	}
	<-writing
	waitPublished(t, db, int64(len(lf.data)))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	checkTopics(t, px.Addr(), lf, 0)
}

// TestRelay_Zombie stops a server (SIGSTOP), starts a second one on the same
// database (so the same transactional id), and lets the first one go on: it
// is fenced, by the database and by Kafka, and exits; the outputs stay
// exactly once.
func TestRelay_Zombie(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
	broker := startBroker(t)
	lf := makeLedger(rng, 20_000)
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db := filepath.Join(dir, "outboxd.db")
	args := []string{"--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--brokers", broker, "--http", "127.0.0.1:0"}
	half := len(lf.data) / 2
	half -= len(lf.data[:half]) - (strings.LastIndexByte(string(lf.data[:half]), '\n') + 1)
	if err := os.WriteFile(input, lf.data[:half], 0o644); err != nil {
		t.Fatal(err)
	}
	older := start(t, nil, args...)
	// Stop it idle: SQLite's write lock held by a stopped process would
	// block the newer server too (busy timeout), whoever owns the data.
	waitPublished(t, db, int64(half))
	older.cmd.Process.Signal(syscall.SIGSTOP)
	newer := start(t, nil, args...)
	appendFile(t, input, string(lf.data[half:]))
	waitPublished(t, db, int64(len(lf.data)))
	older.cmd.Process.Signal(syscall.SIGCONT) // it reads the second half too, and must not apply or publish it
	select {
	case <-older.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the older server went on after it was fenced")
	}
	if code := older.cmd.ProcessState.ExitCode(); code != exitFenced {
		t.Fatalf("older server exit code %d, want %d (fenced)", code, exitFenced)
	}
	if !strings.Contains(older.log.String(), "fenced") && !strings.Contains(older.log.String(), "claimed") {
		t.Fatalf("the older server's log does not say it was fenced:\n%s", tail(older.log.String(), 3000))
	}
	if code := newer.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("newer server exit code %d, want 0", code)
	}
	checkTopics(t, broker, lf, 0)
	checkLedger(t, db, lf, 0)
}
