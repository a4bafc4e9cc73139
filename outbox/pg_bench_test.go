package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkEngine_Emit is BenchmarkTx_Emit on each engine in one run:
// batches of 1,000 items of one output each, committed durably
// (SQLite synchronous=full; PostgreSQL's default synchronous_commit=on).
// It reports this process's CPU per output (cpu-us/row) and, on
// PostgreSQL, the CPU of the server's backend that ran the transactions
// (pg-cpu-us/row; the server is local, its /proc readable).
func BenchmarkEngine_Emit(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) {
		benchEmit(b, filepath.Join(b.TempDir(), "b.db"), nil)
	})
	b.Run("postgres", func(b *testing.B) {
		db := pgtest.New(b)
		benchEmit(b, db.DSN, func(s *outbox.Store) func() time.Duration { return backendCPU(b, s) })
	})
}

func benchEmit(b *testing.B, path string, server func(*outbox.Store) func() time.Duration) {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(path))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var serverCPU func() time.Duration
	if server != nil {
		serverCPU = server(s)
	}
	value := []byte(`{"account":"acct-1","amount":5,"balance":5,"feed":"f","epoch":"e","position":10}`)
	b.ReportAllocs()
	var s0 time.Duration
	if serverCPU != nil {
		s0 = serverCPU()
	}
	c0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; {
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for j := 0; j < 1000 && i < b.N; j, i = j+1, i+1 {
			if err := tx.BeginItem(outbox.Place{Feed: "f", Epoch: "e", Position: int64(i + 1)}); err != nil {
				b.Fatal(err)
			}
			key := fmt.Appendf(nil, "acct-%d", i%1000)
			if err := tx.Emit(ctx, outbox.Output{Topic: "t", Key: key, Value: value}); err != nil {
				b.Fatal(err)
			}
			if err := tx.EndItem(); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-c0).Microseconds())/float64(b.N), "cpu-us/row")
	if serverCPU != nil {
		b.ReportMetric(float64((serverCPU()-s0).Microseconds())/float64(b.N), "pg-cpu-us/row")
	}
}

// processCPU is this process's user and system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU returns a reader of the CPU the server's backend of s's
// writer connection has used, from /proc (0 when unreadable).
func backendCPU(b *testing.B, s *outbox.Store) func() time.Duration {
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var pid int
	err = tx.Get(ctx, &pid, `SELECT pg_backend_pid()`)
	tx.Rollback()
	if err != nil {
		b.Fatal(err)
	}
	return func() time.Duration {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(utime+stime) * (time.Second / 100) // USER_HZ
	}
}
