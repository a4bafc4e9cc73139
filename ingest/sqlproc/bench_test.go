package sqlproc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// benchLedgerFile writes n ledger lines over 1000 accounts, as the Go
// ledger's own benchmark does, and returns the path and the file's size.
func benchLedgerFile(b *testing.B, dir string, n int) (string, int64) {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, "acct-%d,%d\n", i%1000, i%2001-1000)
	}
	path := filepath.Join(dir, "ledger.csv")
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return path, int64(sb.Len())
}

// benchIngest runs b.N lines through the real file feed and loop into a
// real SQLite file with the processor mk makes, and reports lines/s.
func benchIngest(b *testing.B, mk func(b *testing.B, s *outbox.Store) ingest.Processor) {
	dir := b.TempDir()
	path, end := benchLedgerFile(b, dir, b.N)
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(dir, "b.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	proc := mk(b, s)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := ingest.DefaultConfig("ledger")
	cfg.Logger = quiet
	l, err := ingest.NewLoop(s, filefeed.New(path, filefeed.Options{Logger: quiet}), proc, cfg)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	cpu0 := cpuTime(b)
	start := time.Now()
	go func() { done <- l.Run(rctx) }()
	for {
		cps, err := s.ReadPositions(ctx, "ledger")
		if err != nil {
			b.Fatal(err)
		}
		if len(cps) > 0 && cps[0].Position == end {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "lines/s")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/line")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// cpuTime is the CPU time the process has used (user and system): on a
// shared machine it varies less than the wall clock.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkIngest(b *testing.B) {
	b.Run("GoLedger", func(b *testing.B) {
		benchIngest(b, func(*testing.B, *outbox.Store) ingest.Processor { return ledger.New("ledger.out") })
	})
	b.Run("SQLLedger", func(b *testing.B) {
		benchIngest(b, func(b *testing.B, s *outbox.Store) ingest.Processor {
			cfg := loadConfig(b, "ledger", "testdata/ledger.yaml")
			p, err := sqlproc.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := sqlproc.Guard(context.Background(), s); err != nil {
				b.Fatal(err)
			}
			return p
		})
	})
}
