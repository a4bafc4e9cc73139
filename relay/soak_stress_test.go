//go:build stress

package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestRelay_Soak publishes for RELAY_SOAK (default 10m) to three brokers
// while, at random moments, a partition's leader moves, every leader is
// elected again, the transaction coordinators move, or a broker stops
// (its listener closed, its partitions led elsewhere) and starts again
// seconds later. Then every row must be read once with read_committed.
// Run with go test -tags stress -run TestRelay_Soak -v -timeout 30m ./relay/
func TestRelay_Soak(t *testing.T) {
	d := 10 * time.Minute
	if v := os.Getenv("RELAY_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	c := newCluster(t, kfake.NumBrokers(3))
	brokers := c.ListenAddrs()
	var inits atomic.Int32
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		inits.Add(1)
		return nil, nil, false
	})
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.Batch = 500
	cfg.TopicPartitions = 6
	rr := startRelay(t, s, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ids     []int64
		actions = map[string]int{}
	)
	wg.Go(func() { // ingest: 20 rows every 10 ms
		for n := 0; ctx.Err() == nil; n += 20 {
			got := emit(t, s, "f", keyed("t", 20, 13, n)...)
			mu.Lock()
			ids = append(ids, got...)
			mu.Unlock()
			clock.Sleep(ctx, 10*time.Millisecond)
		}
	})
	wg.Go(func() { // chaos
		rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
		ports := map[int32]int{}
		for i, a := range brokers {
			var port int
			fmt.Sscanf(a[len("127.0.0.1:"):], "%d", &port)
			ports[int32(i)] = port
		}
		for ctx.Err() == nil {
			clock.Sleep(ctx, time.Duration(200+rng.IntN(1800))*time.Millisecond)
			if ctx.Err() != nil {
				return
			}
			var what string
			switch k := rng.IntN(10); {
			case k < 4:
				topic, parts := "t", int32(6)
				if k == 0 {
					topic, parts = DefaultProgressTopic, 1
				}
				if c.LeaderFor(topic, 0) < 0 {
					continue // not created yet
				}
				if err := c.MoveTopicPartition(topic, rng.Int32N(parts), rng.Int32N(3)); err != nil {
					what = "move-failed"
				} else {
					what = "move-leader"
				}
			case k < 6:
				c.ShufflePartitionLeaders()
				what = "elect-all"
			case k < 7:
				c.RehashCoordinators()
				what = "move-coordinators"
			default:
				node := rng.Int32N(3)
				if err := c.RemoveNode(node); err != nil {
					t.Errorf("stop broker %d: %v", node, err)
					return
				}
				clock.Sleep(ctx, time.Duration(1000+rng.IntN(4000))*time.Millisecond)
				if _, _, err := c.AddNode(node, ports[node]); err != nil {
					t.Errorf("start broker %d again: %v", node, err)
					return
				}
				what = "stop-start-broker"
			}
			mu.Lock()
			actions[what]++
			mu.Unlock()
		}
	})
	wg.Wait()
	last := ids[len(ids)-1]
	drain := time.Now()
	waitPublishedWithin(t, rr, last, 5*time.Minute)
	st := rr.r.Status()
	t.Logf("%v of publishing: %d rows, %d transactions, %d sessions (InitProducerID), drained %v after the end; "+
		"chaos %v; errors by class %v", d, len(ids), st.Transactions, inits.Load(), time.Since(drain).Round(time.Millisecond),
		actions, st.Errors)
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, readCommitted(t, c.ListenAddrs(), "t"), ids)
}
