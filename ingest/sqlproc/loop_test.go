package sqlproc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// loopRun is a real ingest loop over a file, running in the background.
type loopRun struct {
	loop   *ingest.Loop
	cancel context.CancelFunc
	done   chan error
}

// startLoop runs proc over the file at path through the real file feed and
// loop, as feed name, until the test ends or stop is called.
func startLoop(t *testing.T, s *outbox.Store, name, path string, proc ingest.Processor, change func(*ingest.Config)) *loopRun {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := ingest.DefaultConfig(name)
	cfg.Logger = quiet
	if change != nil {
		change(&cfg)
	}
	l, err := ingest.NewLoop(s, filefeed.New(path, filefeed.Options{Logger: quiet}), proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &loopRun{loop: l, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- l.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the loop and checks it ended well.
func (r *loopRun) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("loop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the loop did not stop")
	}
}

// waitApplied waits until the feed's position on partition 0 is end.
func waitApplied(t *testing.T, s *outbox.Store, feed string, end int64) {
	t.Helper()
	wait(t, 60*time.Second, func() error {
		cps, err := s.ReadPositions(context.Background(), feed)
		if err != nil {
			return err
		}
		if len(cps) == 0 || cps[0].Position != end {
			return fmt.Errorf("feed %s: positions %+v, want %d", feed, cps, end)
		}
		return nil
	})
}

// writeLines writes lines to a new file and returns its path and the
// position after each line.
func writeLines(t *testing.T, lines ...string) (string, []int64) {
	t.Helper()
	var data []byte
	var ends []int64
	for _, l := range lines {
		data = append(append(data, l...), '\n')
		ends = append(ends, int64(len(data)))
	}
	path := filepath.Join(t.TempDir(), "in.csv")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, ends
}

func deadLetters(t *testing.T, s *outbox.Store, feed string) []outbox.DeadLetter {
	t.Helper()
	dls, err := s.DeadLetters(context.Background(), feed, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return dls
}

func feedStats(t *testing.T, s *outbox.Store, feed string) outbox.FeedStats {
	t.Helper()
	st, err := s.Feed(context.Background(), feed)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// runaway is a reject query that never ends for the account "slow" on the
// attempts when: only the attempt's deadline stops it.
func runaway(when string) string {
	return `SELECT 'never' FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c
		WHERE :account = 'slow' AND ` + when + `) SELECT count(*) AS n FROM c) WHERE n < 0`
}

// TestLoop_Retry runs transient failures through the real loop: a retried
// item is applied once, with the attempt that succeeded; one whose retries
// run out is a dead letter, and nothing of it is applied.
func TestLoop_Retry(t *testing.T) {
	retry := func(attempts int, timeout time.Duration) func(*ingest.Config) {
		return func(c *ingest.Config) {
			c.Retry = ingest.Retry{Attempts: attempts, MinDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, AttemptTimeout: timeout}
		}
	}
	withAttempt := func(c sqlproc.Config) sqlproc.Config {
		c.Emit = "SELECT :account AS key, n || '@' || :attempt AS value FROM t WHERE account = :account"
		return c
	}

	t.Run("AttemptDeadline", func(t *testing.T) {
		s := openStore(t, nil)
		cfg := withAttempt(csvConfig())
		cfg.Reject = runaway(":attempt = 1")
		path, ends := writeLines(t, "a,1", "slow,2", "b,3")
		startLoop(t, s, "f", path, newProc(t, cfg), retry(3, time.Second))
		waitApplied(t, s, "f", ends[2])
		sameOutputs(t, outputs(t, s), []out{
			{Position: ends[0], Topic: "p.out", Key: str("a"), Value: str("1@1")},
			{Position: ends[1], Topic: "p.out", Key: str("slow"), Value: str("2@2")},
			{Position: ends[2], Topic: "p.out", Key: str("b"), Value: str("3@1")},
		})
		st := feedStats(t, s, "f")
		if st.Applied != 3 || st.Retries != 1 || st.DeadLettered != 0 {
			t.Fatalf("applied %d, retries %d, dead-lettered %d; want 3, 1, 0", st.Applied, st.Retries, st.DeadLettered)
		}
	})

	t.Run("RetriesExhausted", func(t *testing.T) {
		s := openStore(t, nil)
		cfg := withAttempt(csvConfig())
		cfg.Reject = runaway(":attempt > 0")
		path, ends := writeLines(t, "a,1", "slow,2", "b,3")
		startLoop(t, s, "f", path, newProc(t, cfg), retry(2, time.Second))
		waitApplied(t, s, "f", ends[2])
		var got []out
		for _, o := range outputs(t, s) {
			if o.Topic == "p.out" {
				got = append(got, o)
			}
		}
		sameOutputs(t, got, []out{
			{Position: ends[0], Topic: "p.out", Key: str("a"), Value: str("1@1")},
			{Position: ends[2], Topic: "p.out", Key: str("b"), Value: str("3@1")},
		})
		dls := deadLetters(t, s, "f")
		if len(dls) != 1 || dls[0].Position != ends[1] || dls[0].Reason != ingest.ReasonRetriesSpent ||
			dls[0].Attempts != 2 || string(dls[0].Payload) != "slow,2" {
			t.Fatalf("dead letters = %+v, want slow,2 at %d after 2 attempts, %s", dls, ends[1], ingest.ReasonRetriesSpent)
		}
		if got := counts(t, s, "t"); !reflect.DeepEqual(got, map[string]int64{"a": 1, "b": 3}) {
			t.Fatalf("state = %v", got)
		}
	})

	t.Run("TableLocked", func(t *testing.T) {
		s := openStore(t, nil)
		other, unlock := lockedTable(t, s)
		p := newProc(t, withAttempt(csvConfig()))
		path, ends := writeLines(t, "a,1", "b,2")
		// A ProcessorFunc has no Setup: the loop does not run it, so the
		// processor's t stays the attached aux.t.
		r := startLoop(t, s, "f", path, ingest.ProcessorFunc(p.Apply), retry(1000, 500*time.Millisecond))
		wait(t, 30*time.Second, func() error {
			if _, lastErr := r.loop.State(); lastErr == "" {
				return fmt.Errorf("no attempt has failed yet")
			}
			return nil
		})
		unlock()
		waitApplied(t, s, "f", ends[1])
		got := outputs(t, s)
		st := feedStats(t, s, "f")
		// Each output names the attempt that succeeded: every one before it
		// failed and was counted as a retry.
		var a, b int64
		if len(got) != 2 || got[0].Position != ends[0] || got[1].Position != ends[1] {
			t.Fatalf("outputs:\n%s", fmtOuts(got))
		}
		if _, err := fmt.Sscanf(*got[0].Value+" "+*got[1].Value, "1@%d 2@%d", &a, &b); err != nil {
			t.Fatalf("outputs:\n%s", fmtOuts(got))
		}
		if a < 2 || a-1+b-1 != st.Retries || st.Applied != 2 || st.DeadLettered != 0 {
			t.Fatalf("attempts %d and %d; applied %d, retries %d, dead-lettered %d", a, b, st.Applied, st.Retries, st.DeadLettered)
		}
		var n int
		if err := other.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
			t.Fatalf("aux.t has %d rows, %v; want 2", n, err)
		}
	})
}
