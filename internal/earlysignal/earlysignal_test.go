//go:build unix

package earlysignal

import (
	"errors"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
)

func receive(t *testing.T, ch <-chan os.Signal, want os.Signal) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("received %v, want %v", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%v not received within 5s", want)
	}
}

// TestSignals: the package catches SIGINT and SIGTERM from its initialiser
// on (the test binary is still alive after sending itself both), and
// Release hands those not yet read to whoever handles them next.
func TestSignals(t *testing.T) {
	// Release is for good; catch again after the test, as init did, so a
	// repeated run (-count) starts where the first did.
	t.Cleanup(func() { signal.Notify(caught, syscall.SIGINT, syscall.SIGTERM) })
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	receive(t, Signals(), syscall.SIGINT)

	next := make(chan os.Signal, 4)
	signal.Notify(next, syscall.SIGTERM)
	defer signal.Stop(next)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	receive(t, next, syscall.SIGTERM)
	// The early channel has it too, unread: Release delivers it again.
	// The runtime delivers to both channels: wait for the second.
	testutil.Wait(t, 5*time.Second, func() error {
		if len(caught) == 0 {
			return errors.New("the early channel did not catch SIGTERM")
		}
		return nil
	})
	Release()
	receive(t, next, syscall.SIGTERM)
}
