package ingest_test

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// endlessInsert is a write that never ends: only its context's deadline
// stops it, and SQLite then rolls the whole transaction back, not just the
// statement or the item's savepoint.
const endlessInsert = `INSERT INTO counts SELECT 'never' || count(*), 1
FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT i FROM c)`

// stuckWriter counts values as counter does; the value "slow" first runs
// endlessInsert on the attempts stuck says (all when stuck is nil).
type stuckWriter struct {
	stuck []int

	mu       sync.Mutex
	attempts map[string][]int
}

func (p *stuckWriter) Setup(ctx context.Context, tx *outbox.Tx) error {
	return newCounter().Setup(ctx, tx)
}

func (p *stuckWriter) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	v := string(item.Value)
	p.mu.Lock()
	p.attempts[v] = append(p.attempts[v], d.Attempt)
	p.mu.Unlock()
	if _, err := tx.Exec(ctx, `INSERT INTO counts VALUES (?, 1) ON CONFLICT(value) DO UPDATE SET n = n + 1`, v); err != nil {
		return err
	}
	if v == "slow" && (p.stuck == nil || contains(p.stuck, d.Attempt)) {
		if _, err := tx.Exec(ctx, endlessInsert); err != nil {
			return err
		}
	}
	return tx.Emit(ctx, outbox.Output{Topic: "out", Value: item.Value})
}

func (p *stuckWriter) attemptsOf(v string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.attempts[v]...)
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// An item whose write outlives its attempt's deadline makes SQLite roll
// the whole batch's transaction back. The items before it are applied
// again, once, and the failure counts against the item, under either
// completion failure policy: it is retried with its next attempt, and
// dead-lettered once its attempts are spent; nothing is skipped, no loss
// is recorded, the feed never stalls.
func TestLoop_TransactionLostUnderItem(t *testing.T) {
	for _, policy := range []ingest.CompletionPolicy{ingest.OnCompletionStop, ingest.OnCompletionSkip} {
		t.Run("RetriedThenApplied/"+string(policy), func(t *testing.T) {
			s := outboxtest.TempStore(t)
			f := newMemFeed("e1", "a", "b", "slow", "c")
			p := &stuckWriter{stuck: []int{1}, attempts: map[string][]int{}}
			cfg := lostConfig(policy)
			l, stop := running(t, s, f, p, cfg)
			wait(t, 20*time.Second, positionIs(s, "f", "e1", 4))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got, want := counts(t, s), map[string]int{"a": 1, "b": 1, "slow": 1, "c": 1}; !reflect.DeepEqual(got, want) {
				t.Fatalf("counts = %v, want %v", got, want)
			}
			want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"out", "e1", 2, 0, "b"}, {"out", "e1", 3, 0, "slow"}, {"out", "e1", 4, 0, "c"}}
			if got := outboxRows(t, s); !reflect.DeepEqual(got, want) {
				t.Fatalf("outbox = %v, want %v", got, want)
			}
			if got := p.attemptsOf("slow"); !reflect.DeepEqual(got, []int{1, 2}) {
				t.Fatalf("attempts of slow = %v, want [1 2]", got)
			}
			// a was applied in the lost transaction, then again in the one
			// that committed: each time as its first attempt.
			if got := p.attemptsOf("a"); !reflect.DeepEqual(got, []int{1, 1}) {
				t.Fatalf("attempts of a = %v, want [1 1]", got)
			}
			st := stats(t, s)
			equal(t, "applied", st.Applied, 4)
			equal(t, "retries", st.Retries, 1)
			equal(t, "deadLettered", st.DeadLettered, 0)
			equal(t, "completionFailures", st.CompletionFailures, 0)
			equal(t, "lossless", st.Lossless, true)
			if state, _ := l.State(); state == outbox.StateStalled || state == outbox.StateFailed {
				t.Fatalf("state %s", state)
			}
		})

		t.Run("RetriesSpent/"+string(policy), func(t *testing.T) {
			s := outboxtest.TempStore(t)
			f := newMemFeed("e1", "a", "slow", "c")
			p := &stuckWriter{attempts: map[string][]int{}}
			_, stop := running(t, s, f, p, lostConfig(policy))
			wait(t, 20*time.Second, positionIs(s, "f", "e1", 3))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got, want := counts(t, s), map[string]int{"a": 1, "c": 1}; !reflect.DeepEqual(got, want) {
				t.Fatalf("counts = %v, want %v", got, want)
			}
			want := []rowPlace{{"out", "e1", 1, 0, "a"}, {"f.dlq", "e1", 2, 0, "slow"}, {"out", "e1", 3, 0, "c"}}
			if got := outboxRows(t, s); !reflect.DeepEqual(got, want) {
				t.Fatalf("outbox = %v, want %v", got, want)
			}
			if got := p.attemptsOf("slow"); !reflect.DeepEqual(got, []int{1, 2, 3}) {
				t.Fatalf("attempts of slow = %v, want [1 2 3]", got)
			}
			dls, err := s.DeadLetters(context.Background(), "f", 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(dls) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dls))
			}
			equal(t, "reason", dls[0].Reason, ingest.ReasonRetriesSpent)
			equal(t, "attempts", dls[0].Attempts, 3)
			equal(t, "payload", string(dls[0].Payload), "slow")
			equal(t, "position", dls[0].Position, 2)
			st := stats(t, s)
			equal(t, "applied", st.Applied, 2)
			equal(t, "retries", st.Retries, 2)
			equal(t, "deadLettered", st.DeadLettered, 1)
			equal(t, "completionFailures", st.CompletionFailures, 0)
			equal(t, "lossless", st.Lossless, true)
			if ls := lossesOf(t, s); len(ls) != 0 {
				t.Fatalf("losses %+v, want none", ls)
			}
		})
	}
}

// lostConfig holds a whole test's items in one batch, with attempts short
// enough for the endless write to be interrupted soon.
func lostConfig(policy ingest.CompletionPolicy) ingest.Config {
	cfg := testConfig()
	cfg.BatchWait = time.Second
	cfg.Retry.AttemptTimeout = 200 * time.Millisecond
	cfg.OnCompletionFailure = policy
	return cfg
}
