package filefeed

import (
	"fmt"
	"testing"
)

// BenchmarkLineSplitter splits 64 KiB chunks of ledger lines, as the file
// feed does after each read.
func BenchmarkLineSplitter(b *testing.B) {
	var chunk []byte
	for i := 0; len(chunk) < 64<<10; i++ {
		chunk = fmt.Appendf(chunk, "acct-%d,%d\n", i%1000, i%2001-1000)
	}
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	s := newLineSplitter(1<<20, 0)
	for b.Loop() {
		s.push(chunk)
		for {
			if _, ok := s.next(); !ok {
				break
			}
		}
	}
}
