package relay

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// TestTracker_ErrorsByClass: every failure is counted under its class,
// and a snapshot is a copy.
func TestTracker_ErrorsByClass(t *testing.T) {
	tr := newTracker(ModeExactlyOnce, time.Now)
	want := map[string]int64{"retryable": 0, "ambiguous": 0, "fenced": 0, "fatal": 0}
	if got := tr.snapshot().Errors; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a new relay's errors %v, want %v", got, want)
	}
	tr.failed(StateBackingOff, fmt.Errorf("dial: %w", syscall.ECONNREFUSED))
	tr.failed(StateBackingOff, fmt.Errorf("dial: %w", syscall.ECONNREFUSED))
	tr.failed(StateRefusing, ErrBackInTime)
	tr.failed(StateFenced, ErrFenced)
	tr.failed(StateBackingOff, errors.New("something no one knows"))
	snap := tr.snapshot()
	want = map[string]int64{"retryable": 2, "ambiguous": 1, "fenced": 1, "fatal": 1}
	if fmt.Sprint(snap.Errors) != fmt.Sprint(want) {
		t.Fatalf("errors %v, want %v", snap.Errors, want)
	}
	snap.Errors["fatal"] = 99
	if tr.snapshot().Errors["fatal"] != 1 {
		t.Fatal("a snapshot shares the tracker's map")
	}
}
