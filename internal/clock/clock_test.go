package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	t.Run("Passes", func(t *testing.T) {
		started := time.Now()
		if err := Sleep(context.Background(), 30*time.Millisecond); err != nil {
			t.Fatalf("Sleep = %v, want nil", err)
		}
		if took := time.Since(started); took < 30*time.Millisecond {
			t.Fatalf("Sleep returned after %v, want at least 30ms", took)
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Sleep(ctx, time.Hour) }()
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Sleep = %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Sleep did not return within 10s of its context's end")
		}
	})
	t.Run("Deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := Sleep(ctx, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Sleep = %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("ZeroLive", func(t *testing.T) {
		if err := Sleep(context.Background(), 0); err != nil {
			t.Fatalf("Sleep(0) = %v, want nil", err)
		}
		if err := Sleep(context.Background(), -time.Second); err != nil {
			t.Fatalf("Sleep(-1s) = %v, want nil", err)
		}
	})
	t.Run("ZeroDone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
			t.Fatalf("Sleep(0) on a done context = %v, want context.Canceled", err)
		}
	})
}
