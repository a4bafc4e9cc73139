package outbox_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// testLeases runs the leases' contract on two stores of one database,
// whose clock the test moves.
func testLeases(t *testing.T, a, b *outbox.Store, clock *atomic.Int64) {
	ctx := context.Background()
	const ttl = 5 * time.Second
	term, ok, err := a.AcquireLease(ctx, "relay", "a", ttl)
	testutil.Must(t, err)
	if !ok || term != 1 {
		t.Fatalf("a's acquire = %d, %v; want term 1", term, ok)
	}
	if _, ok, err := b.AcquireLease(ctx, "relay", "b", ttl); err != nil || ok {
		t.Fatalf("b's acquire of a held lease = %v, %v; want refused", ok, err)
	}
	clock.Add(int64(4 * time.Second))
	if ok, err := a.RenewLease(ctx, "relay", "a", 1, ttl); err != nil || !ok {
		t.Fatalf("a's renewal = %v, %v", ok, err)
	}
	clock.Add(int64(4 * time.Second)) // 8s: expired without the renewal, held with it
	if _, ok, err := b.AcquireLease(ctx, "relay", "b", ttl); err != nil || ok {
		t.Fatalf("b's acquire of a renewed lease = %v, %v; want refused", ok, err)
	}
	clock.Add(int64(2 * time.Second)) // 10s: past the renewal's 9s
	term, ok, err = b.AcquireLease(ctx, "relay", "b", ttl)
	testutil.Must(t, err)
	if !ok || term != 2 {
		t.Fatalf("b's acquire of an expired lease = %d, %v; want term 2", term, ok)
	}
	if ok, err := a.RenewLease(ctx, "relay", "a", 1, ttl); err != nil || ok {
		t.Fatalf("a's renewal after b took the lease = %v, %v; want refused", ok, err)
	}
	testutil.Must(t, b.ReleaseLease(ctx, "relay", "b", 2))
	term, ok, err = a.AcquireLease(ctx, "relay", "a", ttl)
	testutil.Must(t, err)
	if !ok || term != 3 {
		t.Fatalf("a's acquire of a released lease = %d, %v; want term 3", term, ok)
	}
	ls, err := b.Leases(ctx)
	testutil.Must(t, err)
	if len(ls) != 1 || ls[0].Holder != "a" || ls[0].Term != 3 || ls[0].ExpiresAt != clock.Load()+int64(ttl) {
		t.Fatalf("leases %+v, want a's at term 3", ls)
	}
}

func leaseClock() (*atomic.Int64, func(*outbox.Config)) {
	clock := &atomic.Int64{}
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return clock, func(c *outbox.Config) { c.Now = func() time.Time { return time.Unix(0, clock.Load()) } }
}

func TestLeases_SQLite(t *testing.T) {
	clock, set := leaseClock()
	cfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "t.db"))
	set(&cfg)
	testLeases(t, outboxtest.OpenStore(t, cfg), outboxtest.OpenStore(t, cfg), clock)
}

func TestLeases_Postgres(t *testing.T) {
	db := pgtest.New(t)
	clock, set := leaseClock()
	cfg := outbox.DefaultConfig(db.DSN)
	set(&cfg)
	testLeases(t, outboxtest.OpenStore(t, cfg), outboxtest.OpenStore(t, cfg), clock)
}
