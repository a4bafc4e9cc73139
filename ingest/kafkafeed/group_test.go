package kafkafeed_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/feedtest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// groupServer is one server's share of a group feed: its store on the
// shared database, its feed and its loop.
type groupServer struct {
	store *outbox.Store
	feed  *kafkafeed.GroupFeed
	stop  context.CancelFunc
	done  chan error
}

// forwardProc emits each item's value as one output.
var forwardProc = ingest.ProcessorFunc(func(ctx context.Context, tx *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
	return tx.Emit(ctx, outbox.Output{Topic: "out", Key: item.Key, Value: item.Value})
})

func startGroupServer(t *testing.T, dsn string, brokers []string, topic, owner string) *groupServer {
	t.Helper()
	s := outboxtest.OpenStore(t, outbox.DefaultConfig(dsn))
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("server", owner)
	f := kafkafeed.NewGroup(kafkafeed.GroupConfig{
		Config: kafkafeed.Config{Brokers: brokers, Topic: topic, Group: "outboxd-group-test",
			CommitInterval: 50 * time.Millisecond, Logger: log},
		Feed: "g", Store: s, Owner: owner,
		SessionTimeout: 6 * time.Second, Heartbeat: 300 * time.Millisecond, RebalanceTimeout: 6 * time.Second,
	})
	cfg := ingest.DefaultConfig("g")
	cfg.Logger = log
	l, err := ingest.NewLoop(s, f, forwardProc, cfg)
	testutil.Must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	gs := &groupServer{store: s, feed: f, stop: cancel, done: make(chan error, 1)}
	go func() { gs.done <- l.Run(ctx) }()
	t.Cleanup(func() { gs.shutdown(t) })
	return gs
}

func (gs *groupServer) shutdown(t *testing.T) {
	if gs.stop == nil {
		return
	}
	gs.stop()
	gs.stop = nil
	if err := <-gs.done; err != nil {
		t.Errorf("loop: %v", err)
	}
}

// waitPositions waits until every one of n partitions of feed g stands at want.
func waitPositions(t *testing.T, s *outbox.Store, n int, want int64) {
	t.Helper()
	feedtest.Wait(t, 60*time.Second, func() error {
		cps, err := s.ReadPositions(context.Background(), "g")
		if err != nil {
			return err
		}
		at := 0
		for _, c := range cps {
			if c.Position == want {
				at++
			}
		}
		if at != n {
			return fmt.Errorf("%d of %d partitions at %d: %+v", at, n, want, cps)
		}
		return nil
	})
}

// TestGroupFeed_TwoServers: two servers' group feeds on one PostgreSQL
// database spread a topic's partitions; one stops, the other takes its
// partitions over from the store's positions: every record is applied
// once, every output written once.
func TestGroupFeed_TwoServers(t *testing.T) {
	db := pgtest.New(t)
	c := newKafka(t)
	const topic, parts, per = "orders", 6, 50
	testutil.Must(t, c.CreateTopic(topic, parts, nil))
	batch := func(round string) {
		for p := range int32(parts) {
			produce(t, c, topic, p, values(fmt.Sprintf("%s-%d-", round, p), per)...)
		}
	}
	batch("r1")
	a := startGroupServer(t, db.DSN, c.ListenAddrs(), topic, "a")
	b := startGroupServer(t, db.DSN, c.ListenAddrs(), topic, "b")
	feedtest.Wait(t, 60*time.Second, func() error {
		ha, hb := a.feed.Held(), b.feed.Held()
		if len(ha) == 0 || len(hb) == 0 || len(ha)+len(hb) != parts {
			return fmt.Errorf("a holds %v, b holds %v: want the %d partitions spread over both", ha, hb, parts)
		}
		return nil
	})
	waitPositions(t, a.store, parts, per)

	b.shutdown(t)
	batch("r2")
	waitPositions(t, a.store, parts, 2*per)
	testutil.Equal(t, "partitions a holds", len(a.feed.Held()), parts)

	owners, err := a.store.PartitionOwners(context.Background(), "g")
	testutil.Must(t, err)
	for _, o := range owners {
		if o.Owner != "a" {
			t.Errorf("partition %d owned by %q, want a", o.Partition, o.Owner)
		}
	}
	rows, err := a.store.Rows(context.Background(), 0, 10*parts*per)
	testutil.Must(t, err)
	seen := map[string]int{}
	for _, r := range rows {
		seen[string(r.Value)]++
	}
	testutil.Equal(t, "outputs", len(rows), 2*parts*per)
	testutil.Equal(t, "distinct outputs", len(seen), 2*parts*per)
	f, err := a.store.Feed(context.Background(), "g")
	testutil.Must(t, err)
	if f.Applied != 2*parts*per || f.ReplaysSkipped != 0 || !f.Lossless {
		t.Fatalf("feed %+v: want %d applied, no replays, lossless", f, 2*parts*per)
	}
}
