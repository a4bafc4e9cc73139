package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A producer whose opening was given up (its context done, the relay
// stopping) sends no InitProducerID afterwards: a late one would bump the
// epoch under the next relay's producer with the same transactional id
// and fence it.
func TestTxnProducer_NoInitAfterItsContext(t *testing.T) {
	c := newCluster(t)
	var inits atomic.Int64
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		inits.Add(1)
		return nil, nil, false
	})
	cfg := testConfig(t, c.ListenAddrs())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p, err := newTxnProducer(ctx, cfg.Brokers, saramaConfig(cfg, "late"), "", cfg.DeliveryTimeout)
	if p != nil {
		p.close()
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("opening with a done context: %v, want context.Canceled", err)
	}
	if n := inits.Load(); n != 0 {
		t.Fatalf("%d InitProducerID requests reached the broker after the context was done, want 0", n)
	}
}
