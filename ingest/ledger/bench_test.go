package ledger_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkIngest runs the real loop over a ledger file through the real
// file feed into a real SQLite file: b.N lines.
func BenchmarkIngest(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "ledger.csv")
	var sb strings.Builder
	for i := range b.N {
		fmt.Fprintf(&sb, "acct-%d,%d\n", i%1000, i%2001-1000)
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	end := int64(sb.Len())
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(dir, "b.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := ingest.DefaultConfig("ledger")
	cfg.Logger = quiet
	l, err := ingest.NewLoop(s, filefeed.New(path, filefeed.Options{Logger: quiet}), ledger.New("ledger.out"), cfg)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
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
	cancel()
	<-done
}
