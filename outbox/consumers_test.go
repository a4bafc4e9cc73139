package outbox_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestStore_ConsumersCountTheSlowest: the backlog and the prunable floor
// are the slowest of the relay and the configured sinks; a sink not
// configured never counts.
func TestStore_ConsumersCountTheSlowest(t *testing.T) {
	s := outboxtest.TempStore(t)
	ctx := context.Background()
	emitN(t, s, 100, 10, 0)
	testutil.Must(t, s.SetRelayProgress(ctx, "r", 90))
	testutil.Must(t, s.SetSinkProgress(ctx, "gone", 5)) // removed from the configuration
	testutil.Equal(t, "floor, relay alone", s.ConsumedThrough(), int64(90))

	testutil.Must(t, s.SetConsumers(ctx, true, []string{"a", "b"}))
	testutil.Equal(t, "floor, sinks at 0", s.ConsumedThrough(), int64(0))
	p, err := s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "pending rows", p.Rows, int64(100))
	testutil.Must(t, s.SetSinkProgress(ctx, "a", 60))
	testutil.Must(t, s.SetSinkProgress(ctx, "b", 40))
	testutil.Must(t, s.SetSinkProgress(ctx, "gone", 1))
	testutil.Equal(t, "floor", s.ConsumedThrough(), int64(40))
	p, err = s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "pending rows", p.Rows, int64(60))
	testutil.Must(t, s.SetSinkProgress(ctx, "b", 100))
	testutil.Equal(t, "floor, the relay slowest", s.ConsumedThrough(), int64(60))
	testutil.Must(t, s.SetRelayProgress(ctx, "r", 100))
	testutil.Equal(t, "floor, a slowest", s.ConsumedThrough(), int64(60))
	p, err = s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "pending rows", p.Rows, int64(40))

	// No relay: the sinks alone.
	testutil.Must(t, s.SetConsumers(ctx, false, []string{"b"}))
	testutil.Equal(t, "floor, b alone", s.ConsumedThrough(), int64(100))
	p, err = s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "pending rows", p.Rows, int64(0))
}

// TestStore_SetConsumersAfterCounting: consumers set after the backlog was
// counted from the relay count the rows between a slower sink and the
// relay, bytes included.
func TestStore_SetConsumersAfterCounting(t *testing.T) {
	s := outboxtest.TempStore(t)
	ctx := context.Background()
	emitN(t, s, 50, 100, 0)
	b2 := emitN(t, s, 50, 100, 50)
	testutil.Must(t, s.SetRelayProgress(ctx, "r", 100))
	p, err := s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "pending, relay done", p.Rows, int64(0))
	testutil.Must(t, s.SetSinkProgress(ctx, "slow", 50))
	testutil.Must(t, s.SetConsumers(ctx, true, []string{"slow"}))
	p, err = s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "pending rows", p.Rows, int64(50))
	testutil.Equal(t, "pending bytes", p.Bytes, b2)
	testutil.Must(t, s.SetSinkProgress(ctx, "slow", 100))
	p, err = s.PendingBacklog(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "pending rows after the sink", p.Rows, int64(0))
	testutil.Equal(t, "pending bytes after the sink", p.Bytes, int64(0))
}
