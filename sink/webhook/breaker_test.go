package webhook

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestBreaker_OneProbeAtATime(t *testing.T) {
	const open = 100 * time.Millisecond
	b := newBreaker(2, open)
	ctx := context.Background()
	for range 2 {
		if probe, err := b.acquire(ctx); err != nil || probe {
			t.Fatalf("acquire of a closed breaker: probe %v, %v", probe, err)
		}
		b.done(false, false)
	}
	if !b.isOpen() {
		t.Fatal("closed after 2 failures, want open")
	}
	openedAt := time.Now()
	type got struct {
		probe bool
		at    time.Time
	}
	res := make(chan got, 3)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			probe, err := b.acquire(ctx)
			if err != nil {
				t.Error(err)
			}
			res <- got{probe, time.Now()}
		})
	}
	first := <-res
	if !first.probe || first.at.Sub(openedAt) < open {
		t.Fatalf("first acquire after %v: probe %v, want the probe after %v", first.at.Sub(openedAt), first.probe, open)
	}
	// The others wait while the probe is out: none is let go yet.
	select {
	case g := <-res:
		t.Fatalf("a second request went while the probe was out (probe %v)", g.probe)
	case <-time.After(3 * open):
	}
	// A failed probe opens it again for a full period.
	b.done(true, false)
	reopened := time.Now()
	second := <-res
	if !second.probe || second.at.Sub(reopened) < open {
		t.Fatalf("after a failed probe: probe %v after %v, want a probe after %v", second.probe, second.at.Sub(reopened), open)
	}
	b.done(true, true)
	third := <-res
	if third.probe || b.isOpen() {
		t.Fatalf("after a good probe: probe %v, open %v; want closed", third.probe, b.isOpen())
	}
	wg.Wait()
}

func TestBreaker_LateFailureOfAnEarlierRequestOnlyCounts(t *testing.T) {
	b := newBreaker(1, time.Hour)
	ctx := context.Background()
	b.acquire(ctx) // two requests out before it opens
	b.acquire(ctx)
	b.done(false, false)
	until := b.until
	b.done(false, false) // the second fails after it opened
	if b.until != until {
		t.Fatal("a request sent before the breaker opened pushed its opening back")
	}
}
