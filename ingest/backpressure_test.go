package ingest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// Past the backlog's bound the loop applies nothing more and says
// backpressure; as the outbox is published it resumes, below nine tenths
// of the bound, and every item is applied once.
func TestLoop_Backpressure(t *testing.T) {
	s := outboxtest.TempStore(t)
	values := make([]string, 1000)
	for i := range values {
		values[i] = fmt.Sprintf("v%04d", i)
	}
	f := newMemFeed("e1", values...)
	cfg := testConfig()
	cfg.BatchMax = 50
	cfg.MaxBacklog = outbox.BacklogLimit{Rows: 200}
	l, stop := running(t, s, f, newCounter(), cfg)
	ctx := context.Background()

	held := func() (outbox.Pending, error) {
		p, err := s.PendingBacklog(ctx)
		if err != nil {
			return p, err
		}
		if st, msg := l.State(); st != outbox.StateBackpressure || !strings.Contains(msg, "past its bound (at most 200 rows)") {
			return p, fmt.Errorf("state %s (%q), want backpressure", st, msg)
		}
		return p, nil
	}
	var p outbox.Pending
	wait(t, 10*time.Second, func() (err error) { p, err = held(); return err })
	// The bound is passed by one batch at most, and nothing moves past it.
	if p.Rows <= 200 || p.Rows > 250 {
		t.Fatalf("held at %d rows, want past 200 by a batch (50) at most", p.Rows)
	}
	time.Sleep(300 * time.Millisecond) // three looks at the backlog: still held
	if again, err := held(); err != nil || again != p {
		t.Fatalf("held at %+v, then %+v (%v): it moved", p, again, err)
	}

	// Published down to 190 rows pending (above nine tenths): still held.
	if err := s.SetRelayProgress(ctx, "r", p.Rows-190); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := held(); err != nil {
		t.Fatalf("at 190 rows of 200: %v", err)
	}
	// Published as fast as it comes: the loop runs to the end.
	wait(t, 30*time.Second, func() error {
		last, err := s.LastOutboxID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetRelayProgress(ctx, "r", last); err != nil {
			t.Fatal(err)
		}
		cps, _ := s.Positions(ctx, "f")
		if cps[0].Position != 1000 {
			return fmt.Errorf("position %d, want %d", cps[0].Position, 1000)
		}
		return nil
	})
	wait(t, 10*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c := counts(t, s)
	for _, v := range values {
		if c[v] != 1 {
			t.Fatalf("%s applied %d times", v, c[v])
		}
	}
	if rows := outboxRows(t, s); len(rows) != 1000 {
		t.Fatalf("%d outbox rows, want 1000", len(rows))
	}
}

// A loop stopped while held ends cleanly, with nothing half done.
func TestLoop_BackpressureShutdown(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a", "b", "c", "d")
	cfg := testConfig()
	cfg.BatchMax = 1
	cfg.MaxBacklog = outbox.BacklogLimit{Bytes: 1}
	l, stop := running(t, s, f, newCounter(), cfg)
	wait(t, 10*time.Second, func() error {
		if st, _ := l.State(); st != outbox.StateBackpressure {
			return fmt.Errorf("state %s", st)
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st, _ := l.State(); st != outbox.StateStopped {
		t.Fatalf("state %s after stop", st)
	}
	if c := counts(t, s); len(c) != 1 || c["a"] != 1 {
		t.Fatalf("counts %v, want a once: one item is past a bound of one byte", c)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB", 2 << 40: "2.0 TiB"} {
		if got := ingest.FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// While a file feed is held at the bound, its end follows the file: lines
// appended meanwhile show in Ends (the status's end and lag), though the
// loop reads none of them; drained, the loop applies each line once.
func TestLoop_BackpressureEndsFollow(t *testing.T) {
	s := outboxtest.TempStore(t)
	path := filepath.Join(t.TempDir(), "in.log")
	var data strings.Builder
	line := func(i int) string { return fmt.Sprintf("v%04d\n", i) }
	for i := range 300 {
		data.WriteString(line(i))
	}
	if err := os.WriteFile(path, []byte(data.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	f := filefeed.New(path, filefeed.Options{})
	cfg := testConfig()
	cfg.BatchMax = 50
	cfg.MaxBacklog = outbox.BacklogLimit{Rows: 200}
	l, stop := running(t, s, f, newCounter(), cfg)
	ctx := context.Background()
	wait(t, 10*time.Second, func() error {
		if st, _ := l.State(); st != outbox.StateBackpressure {
			return fmt.Errorf("state %s, want backpressure", st)
		}
		return nil
	})
	cps, err := s.Positions(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	heldAt := cps[0].Position

	af, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 300; i < 400; i++ {
		af.WriteString(line(i))
		data.WriteString(line(i))
	}
	af.Close()
	size := int64(data.Len())
	wait(t, 10*time.Second, func() error {
		if end := l.Feed().Ends()[0]; end != size {
			return fmt.Errorf("end %d while held, want the file's size %d", end, size)
		}
		return nil
	})
	if st, _ := l.State(); st != outbox.StateBackpressure {
		t.Fatalf("state %s once the end moved, want backpressure", st)
	}
	if cps, _ := s.Positions(ctx, "f"); cps[0].Position != heldAt {
		t.Fatalf("position %d, want %d: held", cps[0].Position, heldAt)
	}

	wait(t, 30*time.Second, func() error {
		last, err := s.LastOutboxID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetRelayProgress(ctx, "r", last); err != nil {
			t.Fatal(err)
		}
		cps, _ := s.Positions(ctx, "f")
		if cps[0].Position != size {
			return fmt.Errorf("position %d, want %d", cps[0].Position, size)
		}
		return nil
	})
	wait(t, 10*time.Second, stateIs(l, outbox.StateCaughtUp, ""))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c := counts(t, s)
	if len(c) != 400 {
		t.Fatalf("%d values applied, want 400", len(c))
	}
	for v, n := range c {
		if n != 1 {
			t.Fatalf("%s applied %d times", v, n)
		}
	}
}
