package kafkafeed_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/feedtest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/outbox"
)

// TestKafkaFeed_Loop runs the ingest loop on a Kafka feed twice, with
// retention deleting unread records in between: the store resumes each
// partition where it stands, records the loss, and the group's offset
// follows the store.
func TestFeed_Loop(t *testing.T) {
	c := newKafka(t)
	const topic = "loop"
	if err := c.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(filepath.Join(t.TempDir(), "o.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	applied := map[string]int{}
	proc := ingest.ProcessorFunc(func(_ context.Context, _ *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
		applied[string(item.Value)]++ // read after the loop stops
		return nil
	})
	run := func(want int64) {
		t.Helper()
		cfg := ingest.DefaultConfig("loop")
		cfg.Logger = testKafkaConfig(t, c, topic).Logger
		l, err := ingest.NewLoop(s, kafkafeed.New(testKafkaConfig(t, c, topic)), proc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx) }()
		feedtest.Wait(t, feedtest.Timeout, func() error {
			cps, err := s.ReadPositions(context.Background(), "loop")
			if err != nil || len(cps) != 1 || cps[0].Position != want {
				return fmt.Errorf("positions %+v (%v), want %d", cps, err, want)
			}
			return nil
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	produce(t, c, topic, 0, values("a", 20)...)
	run(20)
	produce(t, c, topic, 0, values("b", 20)...)
	if err := c.DeleteRecords(topic, 0, 30); err != nil {
		t.Fatal(err)
	}
	run(40)

	losses, err := s.Losses(context.Background(), "loop")
	if err != nil {
		t.Fatal(err)
	}
	if len(losses) != 1 || losses[0].From != 20 || losses[0].To != 30 || losses[0].Reason != kafkafeed.LossRetention {
		t.Fatalf("losses %+v, want one retention loss 20..30", losses)
	}
	f, err := s.Feed(context.Background(), "loop")
	if err != nil {
		t.Fatal(err)
	}
	if f.Lossless || f.Applied != 30 || f.ReplaysSkipped != 0 || f.Kind != ingest.KindKafka || f.Source != topic {
		t.Fatalf("feed %+v: want 30 applied, no replays, not lossless", f)
	}
	for v, n := range applied {
		if n != 1 {
			t.Errorf("%s applied %d times", v, n)
		}
	}
	if len(applied) != 30 {
		t.Errorf("%d records applied, want 30", len(applied))
	}
	offs, err := admin(t, c).FetchOffsets(context.Background(), "outboxd-test")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := offs.Lookup(topic, 0); o.At != 40 {
		t.Fatalf("group offset %+v, want 40 (committed on close)", o)
	}
}
