package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestLoop_RequeueWith: an operator's edited payload is applied in place
// of the stored one, through the same apply path, and recorded with who
// asked; an "edit" equal to the stored payload is none; a discarded dead
// letter is not requeued.
func TestLoop_RequeueWith(t *testing.T) {
	ctx := context.Background()
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a", "down", "c", "gone")
	p := newCounter()
	p.fail["down"] = 3 // every try fails: a dead letter
	p.fail["gone"] = 3
	l, stop := running(t, s, f, p, testConfig())
	defer stop()
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 4))
	dls, err := s.DeadLetters(ctx, "f", 0, 10)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters %d (%v), want 2", len(dls), err)
	}
	down, gone := dls[0].ID, dls[1].ID

	if ok, err := s.DiscardDeadLetter(ctx, "f", gone, outbox.Discard{By: "alice", Note: "test data"}); err != nil || !ok {
		t.Fatalf("discard = %v, %v", ok, err)
	}
	if ok, err := l.RequeueWith(ctx, gone, outbox.Requeue{By: "bob"}); err != nil || ok {
		t.Fatalf("requeue of a discarded dead letter = %v, %v; want false, nil", ok, err)
	}
	ok, err := l.RequeueWith(ctx, down, outbox.Requeue{By: "bob", Note: "typo fixed", Payload: []byte("fixed")})
	if err != nil || !ok {
		t.Fatalf("RequeueWith = %v, %v; want true", ok, err)
	}
	if ok, err := l.RequeueWith(ctx, down, outbox.Requeue{By: "bob", Payload: []byte("fixed again")}); err != nil || ok {
		t.Fatalf("second RequeueWith = %v, %v; want false, nil", ok, err)
	}
	stop()
	if got, want := counts(t, s), map[string]int{"a": 1, "c": 1, "fixed": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v: the edited payload applied once, the stored one never", got, want)
	}
	d, err := s.DeadLetterByID(ctx, "f", down)
	if err != nil {
		t.Fatal(err)
	}
	if string(d.Payload) != "down" || string(d.RequeuedPayload) != "fixed" || d.ResolvedBy != "bob" || d.Note != "typo fixed" || d.RequeuedAt == 0 {
		t.Fatalf("dead letter after the edited requeue: %+v", d)
	}
	if got := p.attempts["fixed"]; !reflect.DeepEqual(got, []int{4}) {
		t.Fatalf("attempts of the edited payload %v, want [4] (the requeue is the 4th)", got)
	}
}

// TestLoop_RequeueWithSamePayload: a payload equal to the stored one is
// not kept as an edit.
func TestLoop_RequeueWithSamePayload(t *testing.T) {
	ctx := context.Background()
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "down")
	p := newCounter()
	p.fail["down"] = 3
	l, stop := running(t, s, f, p, testConfig())
	defer stop()
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 1))
	dls, _ := s.DeadLetters(ctx, "f", 0, 10)
	if ok, err := l.RequeueWith(ctx, dls[0].ID, outbox.Requeue{Payload: []byte("down")}); err != nil || !ok {
		t.Fatalf("RequeueWith = %v, %v", ok, err)
	}
	d, _ := s.DeadLetterByID(ctx, "f", dls[0].ID)
	if d.RequeuedPayload != nil {
		t.Fatalf("requeued payload %q kept for an unchanged payload", d.RequeuedPayload)
	}
}

// TestLoop_RequeueCommitRetried: a requeue's transaction is the loop's: a
// commit failing for a passing reason is retried on the CommitRetry
// schedule, and the dead letter is applied once.
func TestLoop_RequeueCommitRetried(t *testing.T) {
	ctx := context.Background()
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a", "down")
	p := newCounter()
	p.fail["down"] = 3
	l, stop := running(t, s, f, p, testConfig()) // CommitRetry: 3 attempts
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 2))
	dls, err := s.DeadLetters(ctx, "f", 0, 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %d (%v), want 1", len(dls), err)
	}
	failCommits(s, 2) // the first two tries of the requeue's commit
	if ok, err := l.Requeue(ctx, dls[0].ID); err != nil || !ok {
		t.Fatalf("Requeue with two failed commits = %v, %v; want true, nil", ok, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := counts(t, s), map[string]int{"a": 1, "down": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
	if got := p.attempts["down"]; !reflect.DeepEqual(got, []int{1, 2, 3, 4, 4, 4}) {
		t.Fatalf("attempts of the dead letter %v, want [1 2 3 4 4 4]: three tries, then the requeue's three transactions", got)
	}
	equal(t, "applied", stats(t, s).Applied, 2)
}

// TestLoop_RequeueFenced: a requeue that finds the database claimed by
// another process ends the feed, as the loop's own batches do: Run
// returns the error, the state says failed, and later requeues are
// refused with ErrNotRunning.
func TestLoop_RequeueFenced(t *testing.T) {
	ctx := context.Background()
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "down", "a")
	p := newCounter()
	p.fail["down"] = 3
	l, stop := running(t, s, f, p, testConfig())
	wait(t, 5*time.Second, positionIs(s, "f", "e1", 2))
	dls, _ := s.DeadLetters(ctx, "f", 0, 10)
	s.SetCommitHook(func(context.Context) error { return fmt.Errorf("claimed: %w", outbox.ErrFenced) })
	ok, err := l.Requeue(ctx, dls[0].ID)
	if ok || !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("Requeue of a fenced store = %v, %v; want false, ErrFenced", ok, err)
	}
	if err := stop(); !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("Run = %v, want ErrFenced", err)
	}
	if st, msg := l.State(); st != outbox.StateFailed || !strings.Contains(msg, "claimed") {
		t.Fatalf("state %s %q, want failed with the fence", st, msg)
	}
	s.SetCommitHook(nil)
	if ok, err := l.Requeue(ctx, dls[0].ID); ok || !errors.Is(err, ingest.ErrNotRunning) {
		t.Fatalf("Requeue after Run = %v, %v; want ErrNotRunning", ok, err)
	}
	if got, want := counts(t, s), map[string]int{"a": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
	d, _ := s.DeadLetterByID(ctx, "f", dls[0].ID)
	if d.RequeuedAt != 0 {
		t.Fatalf("dead letter marked requeued at %d by a requeue that did not commit", d.RequeuedAt)
	}
}
