//go:build unix

package server

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCheckFileInput_FIFO: a FIFO is refused without being opened (an
// open would wait for a writer).
func TestCheckFileInput_FIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkFileInput(fifo); err == nil || !strings.Contains(err.Error(), fifo+" is not a regular file") {
		t.Fatalf("checkFileInput = %v", err)
	}
}
