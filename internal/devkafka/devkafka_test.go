package devkafka_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/devkafka"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, o devkafka.Options) *devkafka.Broker {
	t.Helper()
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	o.Logger = quiet()
	b, err := devkafka.StartWith(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// produce puts values on topic with an independent franz-go producer.
func produce(t *testing.T, addr, topic string, values ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, v := range values {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// consumeAll reads n records of topic from the start with an independent
// franz-go consumer and returns their values, sorted.
func consumeAll(t *testing.T, addr, topic string, n int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []string
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consume: %d of %d records: %v", len(got), n, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	slices.Sort(got)
	return got
}

// TestBroker_DataDir: records produced before a restart are consumed
// after it, from a broker started on the same directory.
func TestBroker_DataDir(t *testing.T) {
	dir := t.TempDir()
	b1, err := devkafka.StartWith(devkafka.Options{Addr: "127.0.0.1:0", DataDir: dir, AutoCreateTopics: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	addr := b1.Addr()
	produce(t, addr, "kept", "one", "two")
	b1.Close()
	b2 := start(t, devkafka.Options{Addr: addr, DataDir: dir})
	if b2.DataDir() != dir {
		t.Fatalf("data dir %q", b2.DataDir())
	}
	if got := consumeAll(t, b2.Addr(), "kept", 2); fmt.Sprint(got) != "[one two]" {
		t.Fatalf("after restart: %v", got)
	}
}
