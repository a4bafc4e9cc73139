package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestStore_SinkProgress(t *testing.T) {
	s := outboxtest.TempStore(t)
	ctx := context.Background()
	got, err := s.SinkProgress(ctx, "a")
	testutil.Must(t, err)
	testutil.Equal(t, "progress before any", got, int64(0))
	testutil.Must(t, s.SetSinkProgress(ctx, "a", 10))
	testutil.Must(t, s.SetSinkProgress(ctx, "a", 7)) // never back
	testutil.Must(t, s.SetSinkProgress(ctx, "b", 3))
	got, err = s.SinkProgress(ctx, "a")
	testutil.Must(t, err)
	testutil.Equal(t, "progress of a", got, int64(10))
	all, err := s.SinkProgresses(ctx)
	testutil.Must(t, err)
	if len(all) != 2 || all["a"] != 10 || all["b"] != 3 {
		t.Fatalf("progresses %v", all)
	}
	// A sink's progress is not the Kafka relay's.
	pub, err := s.PublishedThrough(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "published through", pub, int64(0))
}

// TestStore_CommitsWakesEveryConsumer: each consumer that took the
// channel before a commit is woken by it; one taken after waits for the
// next.
func TestStore_CommitsWakesEveryConsumer(t *testing.T) {
	s := outboxtest.TempStore(t)
	a, b := s.Commits(), s.Commits()
	select {
	case <-a:
		t.Fatal("woken before any commit")
	default:
	}
	emitN(t, s, 1, 10, 0)
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("a consumer was not woken by the commit")
		}
	}
	c := s.Commits()
	select {
	case <-c:
		t.Fatal("a channel taken after the commit is closed already")
	default:
	}
}

func TestStore_PendingAfter(t *testing.T) {
	s := outboxtest.TempStore(t)
	ctx := context.Background()
	b1 := emitN(t, s, 10, 100, 0)
	b2 := emitN(t, s, 10, 100, 10)
	for _, c := range []struct {
		after int64
		want  outbox.Pending
	}{
		{0, outbox.Pending{Rows: 20, Bytes: b1 + b2}},
		{10, outbox.Pending{Rows: 10, Bytes: b2}},
		{5, outbox.Pending{Rows: 15, Bytes: b1 + b2}}, // a commit partly after counts whole
		{20, outbox.Pending{}},
	} {
		p, err := s.PendingAfter(ctx, c.after)
		testutil.Must(t, err)
		if p != c.want {
			t.Errorf("PendingAfter(%d) = %+v, want %+v", c.after, p, c.want)
		}
	}
}
