package relay

import (
	"strconv"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkMessages turns a relay batch of 4000 rows (a file line each,
// no key, no headers of their own, as the forward processor writes them)
// into records: the relay's own cost per record before the producer's, in a new
// slab each batch, or in the last batch's (as the relay does once that
// batch is settled).
func BenchmarkMessages(b *testing.B) {
	for _, size := range []int{13, 1024} {
		b.Run(strconv.Itoa(size)+"B", func(b *testing.B) { benchMessages(b, size, false) })
		b.Run(strconv.Itoa(size)+"B/reused", func(b *testing.B) { benchMessages(b, size, true) })
	}
}

func benchMessages(b *testing.B, size int, reuse bool) {
	rows := make([]outbox.Row, 4000)
	value := make([]byte, size)
	for i := range rows {
		id := int64(1_000_000 + i)
		rows[i] = outbox.Row{ID: id, Feed: "bench", Epoch: "file:2049:1234567:1700000000000000000", Position: id * 13,
			Topic: "bench.e2e", Value: value, CreatedAt: 1_700_000_000_000_000_000}
	}
	b.ReportAllocs()
	var slab *recordSlab
	for b.Loop() {
		if !reuse {
			slab = nil
		}
		slab = slab.reuse(len(rows))
		if _, err := slab.messages(rows); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/record")
}
