package nats_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/natstest"
	"github.com/outboxd/outboxd/sink"
)

// BenchmarkDeliver publishes batches of 1000 rows of 100 bytes to a real
// nats-server, pipelined (inflight 512, the default) and one message at a
// time (inflight 1: a round trip each).
func BenchmarkDeliver(b *testing.B) {
	for _, inflight := range []int{1, 512} {
		b.Run("inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			srv := natstest.Start(b)
			tg, err := newBenchTarget(b, srv, inflight)
			testutil.Must(b, err)
			ctx := context.Background()
			_, err = tg.Resume(ctx)
			testutil.Must(b, err)
			const batch = 1000
			rows := rowsOf(1, batch, "a")
			for i := range rows {
				rows[i].Value = make([]byte, 100)
			}
			next := int64(1)
			b.ResetTimer()
			for b.Loop() {
				for i := range rows {
					rows[i].ID = next + int64(i)
				}
				if _, err := tg.Deliver(ctx, rows); err != nil {
					b.Fatal(err)
				}
				next += batch
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

func newBenchTarget(b *testing.B, srv *natstest.Server, inflight int) (interface {
	sink.Target
	Resume(context.Context) (int64, error)
}, error) {
	u := srv.URL()
	sp := sink.Spec{Name: "bench", Logger: quiet, Options: map[string]string{"stream": "B", "inflight": strconv.Itoa(inflight)},
		Topics: map[string]sink.TopicMap{"a": {}}}
	var err error
	if sp.URL, err = parseURL(u); err != nil {
		return nil, err
	}
	return newTarget(b, sp), nil
}
