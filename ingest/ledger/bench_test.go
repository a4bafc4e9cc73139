package ledger_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkIngest runs the real loop over a ledger file through the real
// file feed into a real SQLite file: b.N lines over a state of 1,000 and of
// 1,000,000 accounts (written before the timer). Besides ns/op it reports
// the process's CPU time per line, which a shared machine disturbs far
// less than wall time.
func BenchmarkIngest(b *testing.B) {
	for _, accounts := range []int{1000, 1_000_000} {
		b.Run(fmt.Sprintf("accounts=%d", accounts), func(b *testing.B) { benchmarkIngest(b, accounts) })
	}
}

func benchmarkIngest(b *testing.B, accounts int) {
	dir := b.TempDir()
	path := filepath.Join(dir, "ledger.csv")
	var sb strings.Builder
	for i := range b.N {
		h := uint64(i) * 0x9e3779b97f4a7c15
		fmt.Fprintf(&sb, "acct-%d,%d\n", (h>>20)%uint64(accounts), i%2001-1000)
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	end := int64(sb.Len())
	ctx := context.Background()
	cfg := outbox.DefaultConfig(filepath.Join(dir, "b.db"))
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	prefill(b, cfg, accounts)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lc := ingest.DefaultConfig("ledger")
	lc.Logger = quiet
	l, err := ingest.NewLoop(s, filefeed.New(path, filefeed.Options{Logger: quiet}), ledger.New("ledger.out"), lc)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
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
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-us/line")
	cancel()
	<-done
}

// prefill writes accounts balances of 0 for the feed, in key order, through
// a connection of its own opened as the store's writer is.
func prefill(b *testing.B, cfg outbox.Config, accounts int) {
	db, err := sql.Open("sqlite", outbox.DSN(cfg))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	names := make([]string, accounts)
	for i := range names {
		names[i] = "acct-" + strconv.Itoa(i)
	}
	sort.Strings(names)
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	st, err := tx.Prepare(`INSERT INTO ledger_balances (feed, account, balance, lines) VALUES ('ledger', ?, 0, 0)`)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range names {
		if _, err := st.Exec(n); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		b.Fatal(err)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBatchRead applies one batch of 4,000 lines over a state of
// 100,000 accounts with nothing cached (a freshly started processor), with
// and without Prepare's batch read of the balances, and rolls it back: the
// cost of reading state per item against once per batch. It reports ns
// and allocations per line.
func BenchmarkBatchRead(b *testing.B) {
	const accounts, lines = 100_000, 4000
	ctx := context.Background()
	cfg := outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db"))
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	prefill(b, cfg, accounts)
	items := make([]ingest.Item, lines)
	for i := range items {
		h := uint64(i) * 0x9e3779b97f4a7c15
		items[i] = ingest.Item{Value: fmt.Appendf(nil, "acct-%d,%d", (h>>20)%accounts, i%2001-1000)}
	}
	for _, prepare := range []bool{false, true} {
		b.Run(fmt.Sprintf("prepare=%t", prepare), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				batchOnce(b, s, items, prepare)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*lines), "ns/line")
		})
	}
}

// batchOnce applies items in one transaction of a new processor, and
// rolls it back.
func batchOnce(b *testing.B, s *outbox.Store, items []ingest.Item, prepare bool) {
	ctx := context.Background()
	p := ledger.New("out")
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	if prepare {
		if err := p.Prepare(ctx, tx, "ledger", items); err != nil {
			b.Fatal(err)
		}
	}
	for i, it := range items {
		d := ingest.Delivery{Feed: "ledger", Epoch: "e", Position: int64(i + 1)}
		if err := tx.BeginItem(d.Place()); err != nil {
			b.Fatal(err)
		}
		if err := p.Apply(ctx, tx, d, it); err != nil {
			b.Fatal(err)
		}
		if err := tx.EndItem(); err != nil {
			b.Fatal(err)
		}
	}
}
