package kafkafeed_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/feedtest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// recreateRun is a loop on a Kafka feed, run in the background, that keeps
// the values it applied and can be held inside Apply.
type recreateRun struct {
	store *outbox.Store
	feed  *kafkafeed.Feed
	name  string

	mu      sync.Mutex
	applied map[string]int
	hold    chan struct{} // non-nil: Apply waits until it is closed
}

func startRecreateRun(t *testing.T, c *kfake.Cluster, topic string, refresh time.Duration) *recreateRun {
	t.Helper()
	s := outboxtest.StoreAt(t, filepath.Join(t.TempDir(), "o.db"))
	fc := testKafkaConfig(t, c, topic)
	fc.MetadataRefresh = refresh
	rr := &recreateRun{store: s, feed: kafkafeed.New(fc), name: topic, applied: map[string]int{}}
	cfg := ingest.DefaultConfig(topic)
	cfg.Logger = fc.Logger
	l, err := ingest.NewLoop(s, rr.feed, ingest.ProcessorFunc(rr.apply), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		rr.release()
		if err := <-done; err != nil {
			t.Errorf("loop: %v", err)
		}
	})
	return rr
}

func (rr *recreateRun) apply(_ context.Context, _ *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
	rr.mu.Lock()
	hold := rr.hold
	rr.mu.Unlock()
	if hold != nil {
		<-hold
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.applied[string(item.Value)]++
	return nil
}

// holdApply makes Apply wait until release.
func (rr *recreateRun) holdApply() {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.hold = make(chan struct{})
}

func (rr *recreateRun) release() {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.hold != nil {
		close(rr.hold)
		rr.hold = nil
	}
}

// waitPositions waits until every one of parts partitions stands at want,
// in an epoch other than not, and returns the epochs by partition.
func (rr *recreateRun) waitPositions(t *testing.T, parts int, want int64, not map[int32]string) map[int32]string {
	t.Helper()
	epochs := map[int32]string{}
	feedtest.Wait(t, feedtest.Timeout, func() error {
		cps, err := rr.store.ReadPositions(context.Background(), rr.name)
		if err != nil || len(cps) != parts {
			return fmt.Errorf("positions %+v (%v), want %d partitions", cps, err, parts)
		}
		for _, cp := range cps {
			if cp.Position != want || cp.Epoch == not[cp.Partition] {
				return fmt.Errorf("positions %+v, want %d in a new epoch", cps, want)
			}
			epochs[cp.Partition] = cp.Epoch
		}
		return nil
	})
	return epochs
}

// checkApplied checks that the values applied are exactly want, once each.
func (rr *recreateRun) checkApplied(t *testing.T, want [][]byte) {
	t.Helper()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for _, v := range want {
		if n := rr.applied[string(v)]; n != 1 {
			t.Errorf("%s applied %d times, want once", v, n)
		}
	}
	if len(rr.applied) != len(want) {
		t.Errorf("%d values applied, want %d", len(rr.applied), len(want))
	}
}

// appliedPrefix returns how many of vs, from the first, were applied, and
// fails unless exactly those were, once each.
func (rr *recreateRun) appliedPrefix(t *testing.T, vs [][]byte) int {
	t.Helper()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	n := 0
	for n < len(vs) && rr.applied[string(vs[n])] > 0 {
		n++
	}
	for i, v := range vs {
		if want := map[bool]int{true: 1, false: 0}[i < n]; rr.applied[string(v)] != want {
			t.Errorf("%s applied %d times, want %d (the first %d applied, the rest lost)", v, rr.applied[string(v)], want, n)
		}
	}
	return n
}

// feedState is the feed's stored counters and losses.
func (rr *recreateRun) feedState(t *testing.T) (outbox.FeedStats, []outbox.Loss) {
	t.Helper()
	f, err := rr.store.Feed(context.Background(), rr.name)
	if err != nil {
		t.Fatal(err)
	}
	losses, err := rr.store.Losses(context.Background(), rr.name)
	if err != nil {
		t.Fatal(err)
	}
	return f, losses
}

// holdRequests holds every request of key (of version, unless it is -1)
// from the moment it is called until the returned release is: each one
// waits inside the broker, then is handled as usual. held is signalled as
// each one arrives.
func holdRequests(c *kfake.Cluster, key kmsg.Key, version int16) (held <-chan struct{}, release func()) {
	arrived := make(chan struct{}, 1)
	gate := make(chan struct{})
	c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case <-gate:
			c.DropControl()
			return nil, nil, false
		default:
		}
		if version >= 0 && req.GetVersion() != version {
			return nil, nil, false
		}
		select {
		case arrived <- struct{}{}:
		default:
		}
		c.SleepControl(func() { <-gate })
		return nil, nil, false
	})
	var once sync.Once
	return arrived, func() { once.Do(func() { close(gate) }) }
}

// recreate deletes topic and creates it again with parts partitions.
func recreate(t *testing.T, c *kfake.Cluster, topic string, parts int32) {
	t.Helper()
	if err := c.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic(topic, parts, nil); err != nil {
		t.Fatal(err)
	}
}

// TestFeed_Recreated deletes and re-creates a topic while a loop reads it.
// A loss is recorded exactly where input of the old incarnation vanished
// unapplied, and nowhere else; the new incarnation is a new epoch read from
// 0.
func TestFeed_Recreated(t *testing.T) {
	// Every record of the old incarnation was applied; the old consumer's
	// next fetch, at the old offsets, reads the new incarnation's records
	// 20..59 before any metadata request shows the new topic ID. They are
	// recognised as the new incarnation's: no loss.
	t.Run("AllApplied", func(t *testing.T) {
		c := newKafka(t)
		const topic, parts = "all", 3
		if err := c.CreateTopic(topic, parts, nil); err != nil {
			t.Fatal(err)
		}
		// No periodic metadata request: the old consumer's records are
		// what makes the feed look at the topic again.
		rr := startRecreateRun(t, c, topic, time.Hour)
		var want [][]byte
		for p := range int32(parts) {
			vs := values(fmt.Sprint("old", p), 20)
			produce(t, c, topic, p, vs...)
			want = append(want, vs...)
		}
		old := rr.waitPositions(t, parts, 20, nil)
		held, release := holdRequests(c, kmsg.Fetch, -1)
		<-held // the consumer's next fetch waits in the broker
		recreate(t, c, topic, parts)
		for p := range int32(parts) {
			vs := values(fmt.Sprint("new", p), 60)
			produce(t, c, topic, p, vs...)
			want = append(want, vs...)
		}
		release()
		rr.waitPositions(t, parts, 60, old)
		rr.checkApplied(t, want)
		f, losses := rr.feedState(t)
		if len(losses) != 0 || !f.Lossless {
			t.Errorf("losses %+v, lossless %v: want none, every record of both incarnations was applied", losses, f.Lossless)
		}
		if f.Applied != int64(len(want)) || f.EpochChanges != parts {
			t.Errorf("applied %d, epoch changes %d; want %d and %d", f.Applied, f.EpochChanges, len(want), parts)
		}
	})

	// The old incarnation's record at offset 20 is fetched, but the
	// metadata request that would confirm it is answered only after the
	// topic was re-created with 5 records: it was the old incarnation's
	// (the new one holds no offset 20) and is lost, exactly 20..21.
	t.Run("ReadNotConfirmed", func(t *testing.T) {
		c := newKafka(t)
		const topic = "unconfirmed"
		if err := c.CreateTopic(topic, 1, nil); err != nil {
			t.Fatal(err)
		}
		rr := startRecreateRun(t, c, topic, time.Hour)
		first := values("old", 20)
		produce(t, c, topic, 0, first...)
		old := rr.waitPositions(t, 1, 20, nil)
		held, release := holdRequests(c, kmsg.Metadata, 11) // sarama's: the feed's, not the test's clients'
		defer release()
		produce(t, c, topic, 0, []byte("old-20"))
		<-held // a check waits
		feedtest.Wait(t, feedtest.Timeout, func() error {
			if n := kafkafeed.Unconfirmed(rr.feed, 0); n != 1 {
				return fmt.Errorf("%d records wait for confirmation, want old-20", n)
			}
			return nil
		})
		recreate(t, c, topic, 1)
		fresh := values("new", 5)
		produce(t, c, topic, 0, fresh...)
		release()
		rr.waitPositions(t, 1, 5, old)
		rr.checkApplied(t, append(first, fresh...))
		_, losses := rr.feedState(t)
		if len(losses) != 1 || losses[0].Epoch != old[0] || losses[0].From != 20 || losses[0].To != 21 ||
			losses[0].Reason != kafkafeed.LossTopicReplaced {
			t.Fatalf("losses %+v, want one of epoch %s, 20..21", losses, old[0])
		}
	})

	// The loop is held while the old incarnation grows to 10020 records a
	// partition: the feed reads ahead what it may hold, the rest is never
	// fetched. Its high watermark is known all the same, so the loss is
	// exactly the offsets after the last one applied.
	t.Run("UnreadLost", func(t *testing.T) {
		c := newKafka(t)
		const topic, parts, total = "unread", 2, 10020
		if err := c.CreateTopic(topic, parts, nil); err != nil {
			t.Fatal(err)
		}
		rr := startRecreateRun(t, c, topic, 50*time.Millisecond)
		olds := map[int32][][]byte{}
		for p := range int32(parts) {
			olds[p] = values(fmt.Sprint("old", p), total)
			produce(t, c, topic, p, olds[p][:20]...)
		}
		old := rr.waitPositions(t, parts, 20, nil)
		rr.holdApply()
		for p := range int32(parts) {
			produce(t, c, topic, p, olds[p][20:]...)
		}
		feedtest.Wait(t, feedtest.Timeout, func() error {
			if ends := rr.feed.Ends(); ends[0] != total || ends[1] != total {
				return fmt.Errorf("ends %v, want %d: the high watermarks are not confirmed yet", ends, total)
			}
			return nil
		})
		recreate(t, c, topic, parts)
		var fresh [][]byte
		for p := range int32(parts) {
			vs := values(fmt.Sprint("new", p), 10)
			produce(t, c, topic, p, vs...)
			fresh = append(fresh, vs...)
		}
		rr.release()
		rr.waitPositions(t, parts, 10, old)
		f, losses := rr.feedState(t)
		slices.SortFunc(losses, func(a, b outbox.Loss) int { return int(a.Partition - b.Partition) })
		if len(losses) != parts || f.Lossless {
			t.Fatalf("losses %+v, lossless %v: want one a partition", losses, f.Lossless)
		}
		for p := range int32(parts) {
			n := rr.appliedPrefix(t, olds[p])
			l := losses[p]
			if l.Partition != p || l.Epoch != old[p] || l.From != int64(n) || l.To != total || l.Reason != kafkafeed.LossTopicReplaced {
				t.Errorf("partition %d: loss %+v, want %s %d..%d (the first %d records applied)", p, l, old[p], n, total, n)
			}
			// How far the feed read ahead depends on the machine's pace;
			// the held loop leaves some records never read.
			if n < 20 || n >= total {
				t.Errorf("partition %d: %d records applied, want the first 20 and fewer than %d", p, n, total)
			}
		}
		rr.mu.Lock()
		defer rr.mu.Unlock()
		for _, v := range fresh {
			if rr.applied[string(v)] != 1 {
				t.Errorf("%s applied %d times, want once", v, rr.applied[string(v)])
			}
		}
		if !strings.HasPrefix(old[0], strings.Split(old[1], ":")[0]) {
			t.Errorf("epochs %v of one topic ID", old)
		}
	})
}
