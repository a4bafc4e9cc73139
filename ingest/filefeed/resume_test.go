package filefeed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// ffOpenFiles returns how many files the test process has open, or -1
// where it cannot tell.
func ffOpenFiles(t *testing.T) int {
	t.Helper()
	if runtime.GOOS != "linux" {
		return -1
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// TestFeed_ResumeUnsettled opens a feed from a checkpoint while the
// listings of the path's directory do not settle: Open resumes again until
// they do, and each failed try is undone (no file left open, nothing queued
// twice). It counts the process's open files, so it does not run in
// parallel with other tests.
func TestFeed_ResumeUnsettled(t *testing.T) {
	// While the server was stopped, the checkpoint's file (read to a1) got
	// a2, was copied and truncated, got x1, and was rotated to .1 (its copy
	// to .2); b1 is in the file at the path. Resuming takes two listings:
	// one finds the checkpoint's file among the generations, the next (once
	// the file at the path is taken as the next file) finds its copy.
	setUp := func(t *testing.T) (*ffFile, outbox.Checkpoint, []string) {
		ff := ffNewFile(t)
		ff.write("a1\n")
		a := ff.epoch()
		cp := ffStoredAt(a, 3, 3, time.Now())
		ff.write("a2\n")
		ff.copyTruncate(".1")
		ff.write("x1\n")
		ff.rotate()
		ff.write("b1\n")
		x, b := nextFileEpoch(ff.identityOf(ff.path+".1"), a), ff.epoch()
		return ff, cp, []string{ffItem(a, 6, "a2"), ffEpochRec(x), ffItem(x, 3, "x1"), ffEpochRec(b), ffItem(b, 3, "b1")}
	}
	unsettled := func(path string) ([]generation, error) {
		return nil, fmt.Errorf("list generations of %s: %w", path, errUnsettled)
	}
	for _, tc := range []struct {
		name string
		// fails tells whether the listing now is to fail, given whether the
		// feed holds the file at the path as its next file yet.
		fails func(haveNext bool) bool
	}{
		{"WhileTheStoredFileIsLookedFor", func(haveNext bool) bool { return !haveNext }},
		{"WhileItsCopyIsLookedFor", func(haveNext bool) bool { return haveNext }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const tries = 3
			ff, cp, want := setUp(t)
			logs := &ffLogs{}
			f := New(ff.path, Options{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			failed := 0
			f.listOnce = func(path string) ([]generation, error) {
				if failed < tries && tc.fails(f.next != nil) { // called with f.mu held, by Open's goroutine
					failed++
					return unsettled(path)
				}
				return listGenerationsOnce(path)
			}
			open := ffOpenFiles(t)
			if err := f.Open(context.Background(), map[int32]outbox.Checkpoint{0: cp}); err != nil {
				t.Fatalf("open: %v", err)
			}
			if failed != tries {
				t.Fatalf("%d listings failed, want %d: the test did not play the unsettled listings", failed, tries)
			}
			if n := logs.count("resuming again"); n != tries {
				t.Errorf("%d retries logged, want %d", n, tries)
			}
			if got := ffDescribeAll(ffCollect(t, f, len(want))); !slices.Equal(got, want) {
				t.Fatalf("records:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
			}
			ffNoMore(t, f)
			if err := f.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if after := ffOpenFiles(t); after != open {
				t.Errorf("%d files open after Close, %d before Open: a failed try left files open", after, open)
			}
		})
	}
	t.Run("StoredFileRenamedWhileItIsOpened", func(t *testing.T) {
		// The checkpoint's file was rotated to .1 while the server was
		// stopped; as the feed resumes, rotations rename it between the
		// listing that settles and its opening, try after try. That it
		// could not be opened says nothing: taken for gone, a1 would be
		// read again. Open resumes once the renames stop, after a1.
		ff := ffNewFile(t)
		ff.write("a1\n")
		a := ff.epoch()
		cp := ffStoredAt(a, 3, 3, time.Now())
		ff.write("a2\n")
		ff.rotate()
		ff.write("b1\n")
		b := ff.epoch()
		names := [2]string{ff.path + ".1", ff.path + ".3"}
		f := New(ff.path, Options{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		t.Cleanup(func() { f.Close() })
		calls := 0
		f.listOnce = func(path string) ([]generation, error) {
			gens, err := listGenerationsOnce(path)
			// Each second listing agrees with the one before and is then
			// made stale: the file moves to the other name.
			if calls++; calls <= 2*listTries && calls%2 == 0 {
				if err := os.Rename(names[(calls/2+1)%2], names[(calls/2)%2]); err != nil {
					t.Error(err)
				}
			}
			return gens, err
		}
		if err := f.Open(context.Background(), map[int32]outbox.Checkpoint{0: cp}); err != nil {
			t.Fatalf("open: %v", err)
		}
		if calls <= 2*listTries {
			t.Fatalf("%d listings: the test did not rename the file on every try", calls)
		}
		want := []string{ffItem(a, 6, "a2"), ffEpochRec(b), ffItem(b, 3, "b1")}
		if got := ffDescribeAll(ffCollect(t, f, len(want))); !slices.Equal(got, want) {
			t.Fatalf("records:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
		}
		ffNoMore(t, f)
	})
	t.Run("NeverSettles", func(t *testing.T) {
		// Open goes on trying for as long as its context lives, and then
		// says why it stopped.
		ff, cp, _ := setUp(t)
		f := New(ff.path, Options{Logger: slog.New(slog.DiscardHandler)})
		calls := 0
		f.listOnce = func(path string) ([]generation, error) { calls++; return unsettled(path) }
		open := ffOpenFiles(t)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err := f.Open(ctx, map[int32]outbox.Checkpoint{0: cp})
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errUnsettled) {
			t.Fatalf("open: %v, want the deadline and the unsettled listings", err)
		}
		if calls < 2 {
			t.Errorf("%d listings: Open did not try again", calls)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		if after := ffOpenFiles(t); after != open {
			t.Errorf("%d files open after Close, %d before Open", after, open)
		}
	})
	t.Run("ClosedWhileTrying", func(t *testing.T) {
		ff, cp, _ := setUp(t)
		f := New(ff.path, Options{Logger: slog.New(slog.DiscardHandler)})
		tried := make(chan struct{}, 1)
		f.listOnce = func(path string) ([]generation, error) {
			select {
			case tried <- struct{}{}:
			default:
			}
			return unsettled(path)
		}
		errc := make(chan error, 1)
		go func() { errc <- f.Open(context.Background(), map[int32]outbox.Checkpoint{0: cp}) }()
		<-tried
		if err := f.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		select {
		case err := <-errc:
			if !errors.Is(err, fs.ErrClosed) {
				t.Fatalf("open: %v, want an error wrapping fs.ErrClosed", err)
			}
		case <-time.After(ffTimeout):
			t.Fatal("Open went on trying after Close")
		}
	})
	t.Run("OtherErrorsFailAtOnce", func(t *testing.T) {
		ff, cp, _ := setUp(t)
		f := New(ff.path, Options{Logger: slog.New(slog.DiscardHandler)})
		t.Cleanup(func() { f.Close() })
		calls := 0
		f.listOnce = func(path string) ([]generation, error) {
			calls++
			return nil, fmt.Errorf("list generations of %s: %w", path, fs.ErrPermission)
		}
		err := f.Open(context.Background(), map[int32]outbox.Checkpoint{0: cp})
		if !errors.Is(err, fs.ErrPermission) || calls != 1 {
			t.Fatalf("open: %v after %d listings, want the permission error after 1", err, calls)
		}
	})
}
