package pgtable_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/sink/pgtable"
)

// BenchmarkDeliver delivers batches of 1000 outputs (a 100-byte JSON value,
// one header) per op: rows/s is end to end through PostgreSQL, cpu-us/row
// this process's CPU (user+system) per row (the server's is not in it).
func BenchmarkDeliver(b *testing.B) {
	for _, mode := range []pgtable.Mode{pgtable.Insert, pgtable.Upsert} {
		b.Run(string(mode), func(b *testing.B) {
			const batch = 1000
			db := pgtest.New(b)
			tg, err := pgtable.Open(context.Background(), pgtable.Config{DSN: db.DSN, Sink: "bench", Create: true, Mode: mode})
			if err != nil {
				b.Fatal(err)
			}
			defer tg.Close()
			if _, err := tg.Resume(context.Background()); err != nil {
				b.Fatal(err)
			}
			pad := `"` + strings.Repeat("x", 80) + `"`
			rs := make([]outbox.Row, batch)
			next := int64(1)
			fill := func() {
				for i := range rs {
					rs[i] = row(next, 1<<30)
					rs[i].Value = append([]byte(`{"id":1,"pad":`), append([]byte(pad), '}')...)
					next++
				}
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			start := time.Now()
			b.ResetTimer()
			for b.Loop() {
				b.StopTimer()
				fill()
				b.StartTimer()
				if _, err := tg.Deliver(context.Background(), rs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			n := float64(b.N * batch)
			b.ReportMetric(n/time.Since(start).Seconds(), "rows/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/n, "cpu-us/row")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
