package ingest_test

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/testseam"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestDelivery_AlreadyApplied(t *testing.T) {
	for _, tc := range []struct {
		name          string
		epoch         string
		position      int64
		storedEpoch   string
		storedPos     int64
		alreadyApplie bool
	}{
		{"before stored", "e1", 5, "e1", 10, true},
		{"at stored", "e1", 10, "e1", 10, true},
		{"after stored", "e1", 11, "e1", 10, false},
		{"other epoch, before", "e2", 5, "e1", 10, false},
		{"other epoch, after", "e2", 50, "e1", 10, false},
		{"nothing stored", "e1", 5, "", -1, false},
		{"stored epoch unknown", "e1", 5, "", 10, false},
		{"stored position unknown", "e1", 5, "e1", -1, false},
		{"delivery epoch unknown", "", 5, "e1", 10, false},
		{"delivery position unknown", "e1", -1, "e1", 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ingest.Delivery{Feed: "f", Epoch: tc.epoch, Position: tc.position, Sequence: 1, Attempt: 1}
			equal(t, "AlreadyApplied", d.AlreadyApplied(tc.storedEpoch, tc.storedPos), tc.alreadyApplie)
		})
	}
}

func TestLoop_Apply(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := newMemFeed("e1", "a", "b", "c")
		_, stop := running(t, s, f, newCounter(), testConfig())
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if got, want := counts(t, s), map[string]int{"a": 1, "b": 1, "c": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"out", "e1", 2, 0, "b"}, {"out", "e1", 3, 0, "c"}}
		if got := outboxRows(t, s); !reflect.DeepEqual(got, want) {
			t.Fatalf("outbox = %v, want %v", got, want)
		}
		st := stats(t, s)
		equal(t, "applied", st.Applied, 3)
		equal(t, "epochChanges", st.EpochChanges, 0) // the first epoch is not a change
		equal(t, "lossless", st.Lossless, true)
		if len(f.committed) == 0 || f.committed[len(f.committed)-1].Position != 3 {
			t.Fatalf("feed committed %v, want last position 3", f.committed)
		}
	})

	t.Run("SavepointRollsBackOneItem", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := newMemFeed("e1", "a", "bad1", "c")
		cfg := testConfig()
		cfg.BatchWait = time.Second // one batch holds all three
		_, stop := running(t, s, f, newCounter(), cfg)
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		stop()
		if got, want := counts(t, s), map[string]int{"a": 1, "c": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v (bad1's write must be rolled back)", got, want)
		}
		want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"f.dlq", "e1", 2, 0, "bad1"}, {"out", "e1", 3, 0, "c"}}
		if got := outboxRows(t, s); !reflect.DeepEqual(got, want) {
			t.Fatalf("outbox = %v, want %v", got, want)
		}
		dls, err := s.DeadLetters(context.Background(), "f", 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dls))
		}
		d := dls[0]
		equal(t, "reason", d.Reason, ingest.ReasonMalformed)
		equal(t, "error", d.Error, `value "bad1" is bad`)
		equal(t, "payload", string(d.Payload), "bad1")
		equal(t, "position", d.Position, 2)
		equal(t, "sequence", d.Sequence, 2)
		equal(t, "attempts", d.Attempts, 1)
		st := stats(t, s)
		equal(t, "applied", st.Applied, 2)
		equal(t, "deadLettered", st.DeadLettered, 1)
	})

	t.Run("RetryThenSuccess", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := newMemFeed("e1", "a", "flaky", "c")
		p := newCounter()
		p.fail["flaky"] = 2
		_, stop := running(t, s, f, p, testConfig())
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		stop()
		if got, want := counts(t, s), map[string]int{"a": 1, "flaky": 1, "c": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		if got := p.attempts["flaky"]; !reflect.DeepEqual(got, []int{1, 2, 3}) {
			t.Fatalf("attempts = %v, want [1 2 3]", got)
		}
		if got := p.attempts["c"]; !reflect.DeepEqual(got, []int{1}) {
			t.Fatalf("c's attempts = %v, want [1]", got)
		}
		st := stats(t, s)
		equal(t, "applied", st.Applied, 3)
		equal(t, "retries", st.Retries, 2)
		equal(t, "deadLettered", st.DeadLettered, 0)
	})

	t.Run("RetriesSpentThenDeadLetter", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := newMemFeed("e1", "a", "down", "c")
		p := newCounter()
		p.fail["down"] = 1000
		_, stop := running(t, s, f, p, testConfig())
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		stop()
		if got, want := counts(t, s), map[string]int{"a": 1, "c": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		equal(t, "tries", len(p.attempts["down"]), 3)
		dls, _ := s.DeadLetters(context.Background(), "f", 0, 10)
		if len(dls) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dls))
		}
		equal(t, "reason", dls[0].Reason, ingest.ReasonRetriesSpent)
		equal(t, "error", dls[0].Error, "transient trouble")
		equal(t, "attempts", dls[0].Attempts, 3)
		st := stats(t, s)
		equal(t, "retries", st.Retries, 2)
		equal(t, "deadLettered", st.DeadLettered, 1)
		equal(t, "lossless", st.Lossless, true)
	})

	t.Run("StopPolicyStallsThenResumes", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := newMemFeed("e1", "a", "down", "c")
		p := newCounter()
		p.fail["down"] = 1000
		cfg := testConfig()
		cfg.OnFailure = ingest.OnFailureStop
		cfg.StallMaxDelay = 20 * time.Millisecond
		l, stop := running(t, s, f, p, cfg)
		// The reason counts the tries, the stored one the first stall's.
		const why = "item at f[0] position 2 failed 3 times: transient trouble"
		wait(t, 5*time.Second, func() error {
			st, e := l.State()
			if st != outbox.StateStalled || !regexp.MustCompile(`^item at f\[0\] position 2 failed \d+ times: transient trouble$`).MatchString(e) {
				return fmt.Errorf("state %s (%q), want stalled on item 2", st, e)
			}
			return nil
		})
		if err := positionIs(s, "f", "e1", 1)(); err != nil {
			t.Fatal(err)
		}
		if got, want := counts(t, s), map[string]int{"a": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		equal(t, "stored lastError", stats(t, s).LastError, why)

		p.mu.Lock()
		p.fail["down"] = 0 // the cause is gone
		p.mu.Unlock()
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if got, want := counts(t, s), map[string]int{"a": 1, "down": 1, "c": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"out", "e1", 2, 0, "down"}, {"out", "e1", 3, 0, "c"}}
		if got := outboxRows(t, s); !reflect.DeepEqual(got, want) {
			t.Fatalf("outbox = %v, want %v", got, want)
		}
		p.mu.Lock()
		tries := p.attempts["down"]
		p.mu.Unlock()
		for i, a := range tries {
			if a != i+1 {
				t.Fatalf("attempts of down = %v, want 1, 2, 3, ...", tries)
			}
		}
		st := stats(t, s)
		equal(t, "applied", st.Applied, 3)
		equal(t, "retries", st.Retries, int64(len(tries)-1))
		equal(t, "deadLettered", st.DeadLettered, 0)
		equal(t, "lossless", st.Lossless, true)
		equal(t, "stored lastError", st.LastError, "")
	})
}

// preparedCounter returns a counter whose table exists, without a Setup
// that would commit.
func preparedCounter(t *testing.T, s *outbox.Store) ingest.Processor {
	c := newCounter()
	tx, err := s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ingest.ProcessorFunc(c.Apply)
}

// failCommits makes the next n commits of s fail.
func failCommits(s interface {
	SetCommitHook(func(context.Context) error)
}, n int) {
	left := n
	s.SetCommitHook(func(context.Context) error {
		if left > 0 {
			left--
			return fmt.Errorf("injected commit failure")
		}
		return nil
	})
}

func TestLoop_CompletionFailure(t *testing.T) {
	t.Run("StopStallsThenResumes", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := newMemFeed("e1", "a", "b")
		p := preparedCounter(t, s)
		failCommits(s, 1000)
		cfg := testConfig()
		cfg.StallMaxDelay = 20 * time.Millisecond
		l, stop := running(t, s, f, p, cfg)
		const why = "completion failure: store error: commit: injected commit failure"
		wait(t, 5*time.Second, stateIs(l, outbox.StateStalled, why))
		cps, _ := s.Positions(context.Background(), "f")
		if len(cps) != 0 {
			t.Fatalf("positions %v, want none stored", cps)
		}
		equal(t, "outbox rows", len(outboxRows(t, s)), 0)
		st := stats(t, s)
		equal(t, "completionFailures", st.CompletionFailures, 0)
		equal(t, "lossless", st.Lossless, true)

		s.SetCommitHook(nil) // the cause is gone
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 2))
		wait(t, 5*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if got, want := counts(t, s), map[string]int{"a": 1, "b": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"out", "e1", 2, 0, "b"}}
		if got := outboxRows(t, s); !reflect.DeepEqual(got, want) {
			t.Fatalf("outbox = %v, want %v", got, want)
		}
		st = stats(t, s)
		equal(t, "applied", st.Applied, 2)
		equal(t, "completionFailures", st.CompletionFailures, 0)
		equal(t, "lossless", st.Lossless, true)
		equal(t, "stored lastError", st.LastError, "")
		state, _ := l.State()
		equal(t, "state after shutdown", state, outbox.StateStopped)
	})

	t.Run("Skip", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		f := newMemFeed("e1")
		cfg := testConfig()
		cfg.OnCompletionFailure = ingest.OnCompletionSkip
		cfg.StallMaxDelay = 20 * time.Millisecond
		l, stop := running(t, s, f, newCounter(), cfg)
		f.append("e1", "a")
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
		// Every try of the next batch fails, and then the try of its first
		// half, its first item: that item is skipped; the next commits.
		failCommits(s, cfg.CommitRetry.Attempts+1)
		f.append("e1", "b", "c")
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
		s.SetCommitHook(nil)
		f.append("e1", "d")
		wait(t, 5*time.Second, positionIs(s, "f", "e1", 4))
		stop()
		// Only b, which could not commit alone, is skipped: c commits.
		if got, want := counts(t, s), map[string]int{"a": 1, "c": 1, "d": 1}; !reflect.DeepEqual(got, want) {
			t.Fatalf("counts = %v, want %v", got, want)
		}
		st := stats(t, s)
		equal(t, "completionFailures", st.CompletionFailures, 1)
		equal(t, "lossless", st.Lossless, false)
		equal(t, "applied", st.Applied, 3)
		ls, err := s.Losses(context.Background(), "f")
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != 1 {
			t.Fatalf("losses = %v, want 1", ls)
		}
		equal(t, "from", ls[0].From, 1)
		equal(t, "to", ls[0].To, 2)
		equal(t, "reason", ls[0].Reason, "completion failure skipped: commit: injected commit failure")
		stop()
		state, _ := l.State()
		equal(t, "state", state, outbox.StateStopped)
	})
}

func TestLoop_Replay(t *testing.T) {
	for _, tc := range []struct {
		name      string
		guard     bool
		wantCount int
		replays   int64
	}{
		{"GuardSkips", true, 1, 2},
		{"NoGuardDoubleApplies", false, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := outboxtest.TempStore(t)
			f := newMemFeed("e1", "a", "b", "c")
			_, stop := running(t, s, f, newCounter(), testConfig())
			wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
			stop()

			cfg := testConfig()
			// re-deliver b and c; without the guard's authority (the stored
			// position moved back) they are applied again
			if !tc.guard {
				if err := testseam.MoveBack(context.Background(), s, cfg.Name, 0, 1); err != nil {
					t.Fatal(err)
				}
			}
			f2 := testseam.Rewound(newMemFeed("e1", "a", "b", "c", "d"), map[int32]int64{0: 1})
			_, stop = running(t, s, f2, newCounter(), cfg)
			wait(t, 5*time.Second, positionIs(s, "f", "e1", 4))
			stop()
			want := map[string]int{"a": 1, "b": tc.wantCount, "c": tc.wantCount, "d": 1}
			if got := counts(t, s); !reflect.DeepEqual(got, want) {
				t.Fatalf("counts = %v, want %v", got, want)
			}
			equal(t, "replaysSkipped", stats(t, s).ReplaysSkipped, tc.replays)
		})
	}
}

func TestLoop_NewEpoch(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a", "b", "c")
	_, stop := running(t, s, f, newCounter(), testConfig())
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
	f.add(ingest.Record{Kind: ingest.RecordLoss, Epoch: "e1", From: 3, To: 7, Reason: "truncated"},
		ingest.Record{Kind: ingest.RecordEpoch, Epoch: "e2"})
	f.append("e2", "a", "b")
	wait(t, 5*time.Second, positionIs(s, "f", "e2", 2))
	stop()
	if got, want := counts(t, s), map[string]int{"a": 2, "b": 2, "c": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v (a new epoch applies every item)", got, want)
	}
	st := stats(t, s)
	equal(t, "epochChanges", st.EpochChanges, 1)
	equal(t, "lossless", st.Lossless, false)
	ls, _ := s.Losses(context.Background(), "f")
	if len(ls) != 1 || ls[0].From != 3 || ls[0].To != 7 || ls[0].Epoch != "e1" || ls[0].Reason != "truncated" {
		t.Fatalf("losses = %+v", ls)
	}
	n, err := s.AckLosses(context.Background(), "f")
	if err != nil || n != 1 {
		t.Fatalf("AckLosses = %d, %v", n, err)
	}
	equal(t, "lossless after ack", stats(t, s).Lossless, true)
	ls, _ = s.Losses(context.Background(), "f")
	if len(ls) != 1 || ls[0].AckedAt == 0 {
		t.Fatalf("losses after ack = %+v, want the one loss kept and acked", ls)
	}
}

func TestLoop_Requeue(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a", "down", "c")
	p := newCounter()
	p.fail["down"] = 3 // every try of the first round fails
	l, stop := running(t, s, f, p, testConfig())
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 3))
	dls, _ := s.DeadLetters(context.Background(), "f", 0, 10)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	ok, err := l.Requeue(context.Background(), dls[0].ID)
	if err != nil || !ok {
		t.Fatalf("Requeue = %v, %v; want true", ok, err)
	}
	ok, err = l.Requeue(context.Background(), dls[0].ID)
	if err != nil || ok {
		t.Fatalf("second Requeue = %v, %v; want false, nil", ok, err)
	}
	if _, err := l.Requeue(context.Background(), 999); err == nil {
		t.Fatal("Requeue of an unknown dead letter succeeded")
	}
	stop()
	if got, want := counts(t, s), map[string]int{"a": 1, "down": 1, "c": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
	if got := p.attempts["down"]; !reflect.DeepEqual(got, []int{1, 2, 3, 4}) {
		t.Fatalf("attempts = %v, want [1 2 3 4] (the requeue is the 4th)", got)
	}
	st := stats(t, s)
	equal(t, "applied", st.Applied, 3)
	equal(t, "deadLettered", st.DeadLettered, 1)
	rows := outboxRows(t, s)
	want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"f.dlq", "e1", 2, 0, "down"}, {"out", "e1", 3, 0, "c"}, {"out", "e1", 2, 0, "down"}}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("outbox = %v, want %v", rows, want)
	}
}
