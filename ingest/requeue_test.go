package ingest_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// TestLoop_RequeueWith: an operator's edited payload is applied in place
// of the stored one, through the same apply path, and recorded with who
// asked; an "edit" equal to the stored payload is none; a discarded dead
// letter is not requeued.
func TestLoop_RequeueWith(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
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
	s := openStore(t)
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
