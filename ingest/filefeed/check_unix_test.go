//go:build unix

package filefeed_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/outboxd/outboxd/ingest/filefeed"
)

// TestCheck_FIFO: a FIFO is refused without being opened (an open would
// wait for a writer).
func TestCheck_FIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := filefeed.Check(fifo); err == nil || !strings.Contains(err.Error(), fifo+": not a regular file") {
		t.Fatalf("Check = %v", err)
	}
}
