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
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
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

// ingestRun is one timed run of the real file feed and loop into a real
// SQLite file.
type ingestRun struct {
	wall, cpu time.Duration
}

// ingest runs n ledger lines through the real file feed and loop, with the
// processor mk makes, into a new store, and times it from the loop's start
// to the last line's commit.
func runIngest(b *testing.B, n int, mk func(b *testing.B, s *outbox.Store) ingest.Processor) ingestRun {
	return runIngestCfg(b, n, mk, func(*ingest.Config) {})
}

// runIngestCfg is runIngest with the loop's configuration changed by set.
func runIngestCfg(b *testing.B, n int, mk func(b *testing.B, s *outbox.Store) ingest.Processor, set func(*ingest.Config)) ingestRun {
	return runIngestOn(b, n, "", mk, set)
}

// runIngestOn is runIngestCfg on the database db: a SQLite file in a
// temporary directory when db is "".
func runIngestOn(b *testing.B, n int, db string, mk func(b *testing.B, s *outbox.Store) ingest.Processor, set func(*ingest.Config)) ingestRun {
	b.Helper()
	dir := b.TempDir()
	path, end := benchLedgerFile(b, dir, n)
	ctx := context.Background()
	if db == "" {
		db = filepath.Join(dir, "b.db")
	}
	s, err := outbox.Open(ctx, outbox.DefaultConfig(db))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	proc := mk(b, s)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := ingest.DefaultConfig("ledger")
	cfg.Logger = quiet
	set(&cfg)
	l, err := ingest.NewLoop(s, filefeed.New(path, filefeed.Options{Logger: quiet}), proc, cfg)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu0, start := cpuTime(b), time.Now()
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
	r := ingestRun{wall: time.Since(start), cpu: cpuTime(b) - cpu0}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return r
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

func goLedger(*testing.B, *outbox.Store) ingest.Processor { return ledger.New("ledger.out") }

// sqlLedger is the SQL ledger of testdata/ledger.yaml, the golden test's.
func sqlLedger(b *testing.B, s *outbox.Store) ingest.Processor {
	p, err := sqlproc.New(loadConfig(b, "ledger", "testdata/ledger.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	if err := sqlproc.Guard(context.Background(), s); err != nil {
		b.Fatal(err)
	}
	return p
}

func report(b *testing.B, r ingestRun) {
	b.ReportMetric(float64(b.N)/r.wall.Seconds(), "lines/s")
	b.ReportMetric(float64(r.cpu.Nanoseconds())/float64(b.N), "cpu-ns/line")
}

// BenchmarkIngest is the Go ledger and the SQL ledger through the real
// loop on the same lines (as ingest/ledger's BenchmarkIngest): b.N lines.
// Run it with -benchtime 200000x or more, so the loop's start is noise.
// "SQLLedgerNoAttemptTimeout" runs the SQL ledger with no attempt
// timeout: its statements' context has no deadline, so nothing watches
// it; the difference is what bounding an attempt costs (the store's one
// watch per context, see outbox.Tx.Batch).
func BenchmarkIngest(b *testing.B) {
	b.Run("GoLedger", func(b *testing.B) { report(b, runIngest(b, b.N, goLedger)) })
	b.Run("SQLLedger", func(b *testing.B) { report(b, runIngest(b, b.N, sqlLedger)) })
	b.Run("SQLLedgerNoAttemptTimeout", func(b *testing.B) {
		report(b, runIngestCfg(b, b.N, sqlLedger, func(c *ingest.Config) { c.Retry.AttemptTimeout = 0 }))
	})
}

// BenchmarkIngestRatio runs both ledgers on b.N lines each, one after the
// other, and reports the SQL ledger's ingest throughput as a fraction of
// the Go ledger's: on a shared machine, two runs close in time compare
// better than two benchmarks.
func BenchmarkIngestRatio(b *testing.B) {
	g := runIngest(b, b.N, goLedger)
	q := runIngest(b, b.N, sqlLedger)
	b.ReportMetric(float64(b.N)/g.wall.Seconds(), "go-lines/s")
	b.ReportMetric(float64(b.N)/q.wall.Seconds(), "sql-lines/s")
	b.ReportMetric(g.wall.Seconds()/q.wall.Seconds(), "sql/go")
}

// pgSQLLedger is the SQL ledger of testdata/ledger.pg.yaml, the PostgreSQL
// golden test's.
func pgSQLLedger(b *testing.B, _ *outbox.Store) ingest.Processor {
	p, err := sqlproc.NewPostgres(loadConfig(b, "ledger", "testdata/ledger.pg.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkIngestPostgres is BenchmarkIngest on PostgreSQL (a database of
// its own per run): the Go ledger and the SQL ledger of
// testdata/ledger.pg.yaml. cpu-ns/line is outboxd's process only; the
// PostgreSQL server's own CPU is not in it.
func BenchmarkIngestPostgres(b *testing.B) {
	none := func(*ingest.Config) {}
	b.Run("GoLedger", func(b *testing.B) { report(b, runIngestOn(b, b.N, pgtest.New(b).DSN, goLedger, none)) })
	b.Run("SQLLedger", func(b *testing.B) { report(b, runIngestOn(b, b.N, pgtest.New(b).DSN, pgSQLLedger, none)) })
}
