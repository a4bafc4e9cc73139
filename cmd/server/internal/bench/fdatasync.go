package bench

import (
	"fmt"
	"os"
	"slices"
	"time"
)

// syncResult is the disk's latency of one durable write: a page written
// in place in a file and flushed to the disk (fdatasync), as a commit of
// synchronous=full flushes its write-ahead log. No commit can be faster.
type syncResult struct {
	Count int     `json:"count"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// fdatasyncProbes is how many durable writes the latency phase times.
const fdatasyncProbes = 500

// probeSpan is the size of the probe's file: its pages are overwritten in
// turn, as a write-ahead log's are once it has reached its size.
const probeSpan = 1 << 20

// measureFdatasync times n durable writes of a 4 KiB page at path (on the
// disk the databases are on), then removes the file.
func measureFdatasync(path string, n int) (*syncResult, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("fdatasync probe: %w", err)
	}
	defer os.Remove(path)
	defer f.Close()
	page := make([]byte, 4096)
	if _, err := f.Write(make([]byte, probeSpan)); err != nil {
		return nil, fmt.Errorf("fdatasync probe: %w", err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("fdatasync probe: %w", err)
	}
	took := make([]time.Duration, 0, n)
	for i := range n {
		page[0] = byte(i)
		start := time.Now()
		if _, err := f.WriteAt(page, int64(i*len(page))%probeSpan); err != nil {
			return nil, fmt.Errorf("fdatasync probe: %w", err)
		}
		if err := fdatasync(f); err != nil {
			return nil, fmt.Errorf("fdatasync probe: %w", err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return &syncResult{Count: n, P50Ms: millis(percentile(took, 0.5)), P99Ms: millis(percentile(took, 0.99)),
		MaxMs: millis(percentile(took, 1))}, nil
}
