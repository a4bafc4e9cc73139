package kafkafeed_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// processCPU is the CPU time (user and system) the process has used.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fill writes n 100-byte records over parts partitions of topic.
func fill(b *testing.B, brokers []string, topic string, parts, n int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	testutil.Must(b, err)
	defer cl.Close()
	v := make([]byte, 100)
	for i := 0; i < n; i += 1000 {
		var recs []*kgo.Record
		for j := i; j < min(i+1000, n); j++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(j % parts), Key: []byte(fmt.Sprint(j)), Value: v})
		}
		testutil.Must(b, cl.ProduceSync(context.Background(), recs...).FirstErr())
	}
}

// BenchmarkFeeds_Poll reads b.N records of a 12-partition topic from
// kfake in-process, as the loop does (Poll up to 1,000, then Commit the
// positions), with the plain feed and with the group feed: the process's
// CPU per record, kfake's share of it included. The timer includes the
// open (the group feed's join and claims): run it with -benchtime of
// 100000x or more.
func BenchmarkFeeds_Poll(b *testing.B) {
	const parts = 12
	for _, kind := range []string{"feed", "group"} {
		b.Run(kind, func(b *testing.B) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1))
			testutil.Must(b, err)
			defer c.Close()
			testutil.Must(b, c.CreateTopic("bench", parts, nil))
			fill(b, c.ListenAddrs(), "bench", parts, b.N)
			s := outboxtest.OpenStore(b, outbox.DefaultConfig(filepath.Join(b.TempDir(), "b.db")))
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			cfg := kafkafeed.Config{Brokers: c.ListenAddrs(), Topic: "bench", Group: "bench", Logger: log}
			var f ingest.Feed = kafkafeed.New(cfg)
			if kind == "group" {
				f = kafkafeed.NewGroup(kafkafeed.GroupConfig{Config: cfg, Feed: "bench", Store: s, Owner: "b"})
			}
			defer f.Close()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU(b)
			testutil.Must(b, f.Open(context.Background(), nil))
			buf := make([]ingest.Record, 0, 1000)
			got := 0
			for got < b.N {
				var err error
				buf, err = f.Poll(context.Background(), buf[:0], 1000)
				testutil.Must(b, err)
				last := map[int32]outbox.Checkpoint{}
				for _, r := range buf {
					if r.Kind == ingest.RecordItem {
						got++
					}
					last[r.Partition] = outbox.Checkpoint{Partition: r.Partition, Epoch: r.Epoch, Position: r.Position}
				}
				through := make([]outbox.Checkpoint, 0, len(last))
				for _, c := range last {
					through = append(through, c)
				}
				testutil.Must(b, f.Commit(context.Background(), through))
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/record")
		})
	}
}
