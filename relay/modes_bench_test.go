package relay

import (
	"fmt"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// BenchmarkRelayModes publishes benchRows outbox rows per iteration (100
// keys, 100-byte values, one header) in batches of 1000, in each mode, to
// an in-process kfake broker, and reports the process's CPU per row while
// it publishes (the relay's, sarama's and the broker's; filling the outbox
// is not counted): the two modes' costs side by side.
func BenchmarkRelayModes(b *testing.B) {
	for _, mode := range []Mode{ModeExactlyOnce, ModeAtLeastOnce} {
		b.Run(string(mode), func(b *testing.B) { benchRelayMode(b, mode) })
	}
}

func benchRelayMode(b *testing.B, mode Mode) {
	c := newCluster(b)
	if err := c.CreateTopic("bench", 3, nil); err != nil {
		b.Fatal(err)
	}
	s := outboxtest.TempStore(b)
	cfg := DefaultConfig()
	cfg.Brokers = c.ListenAddrs()
	cfg.Mode = mode
	cfg.Logger = slog.New(slog.DiscardHandler)
	rr := startRelay(b, s, cfg)
	wait(b, 10*time.Second, func() error {
		if !rr.r.Status().Connected {
			return fmt.Errorf("not connected: %+v", rr.r.Status())
		}
		return nil
	})
	b.ReportAllocs()
	b.ResetTimer()
	var cpu, published time.Duration
	for range b.N {
		b.StopTimer()
		last := fillOutbox(b, s, benchRows)
		b.StartTimer()
		start, cpu0 := time.Now(), processCPU(b)
		for rr.r.Status().LastPublishedID < last {
			time.Sleep(time.Millisecond)
		}
		cpu += processCPU(b) - cpu0
		published += time.Since(start)
	}
	rows := float64(b.N * benchRows)
	b.ReportMetric(rows/published.Seconds(), "rows/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/rows, "cpu-ns/row")
	b.ReportMetric(0, "ns/op")
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
