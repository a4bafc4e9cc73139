package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// benchRows is how many rows each benchmark iteration publishes.
const benchRows = 100_000

// benchValue is a 100-byte record value.
var benchValue = []byte(fmt.Sprintf("%0100d", 42))

// fillOutbox writes n rows in one ingest transaction (100 keys, 100-byte
// values, one header) and returns the last id.
func fillOutbox(b *testing.B, s *outbox.Store, n int) int64 {
	b.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	hs := []outbox.Header{{Key: "type", Value: []byte("bench")}}
	for i := range n {
		tx.SetPlace(outbox.Place{Feed: "bench", Epoch: "e1", Position: int64(i)})
		o := outbox.Output{Topic: "bench", Key: []byte("key-" + strconv.Itoa(i%100)), Value: benchValue, Headers: hs}
		if err := tx.Emit(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	last, err := s.LastOutboxID(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return last
}

// BenchmarkRelay publishes benchRows outbox rows per iteration, exactly
// once, in transactions of 1000, to an in-process kfake broker.
func BenchmarkRelay(b *testing.B) {
	c := newCluster(b)
	if err := c.CreateTopic("bench", 3, nil); err != nil {
		b.Fatal(err)
	}
	s := outboxtest.TempStore(b)
	cfg := DefaultConfig()
	cfg.Brokers = c.ListenAddrs()
	cfg.Logger = slog.New(slog.DiscardHandler)
	rr := startRelay(b, s, cfg)
	wait(b, 10*time.Second, func() error {
		if !rr.r.Status().Connected {
			return fmt.Errorf("not connected: %+v", rr.r.Status())
		}
		return nil
	})
	b.ReportAllocs()
	b.ResetTimer()
	var published time.Duration
	for range b.N {
		b.StopTimer()
		last := fillOutbox(b, s, benchRows)
		b.StartTimer()
		start := time.Now()
		for rr.r.Status().LastPublishedID < last {
			time.Sleep(200 * time.Microsecond)
		}
		published += time.Since(start)
	}
	b.ReportMetric(float64(b.N*benchRows)/published.Seconds(), "rows/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRawProduce is the ceiling: the relay's transactional producer
// alone sending the same records (with the relay's headers) in
// transactions of 1000 to the same kind of broker, no SQLite, no progress
// record.
func BenchmarkRawProduce(b *testing.B) {
	c := newCluster(b)
	if err := c.CreateTopic("bench", 3, nil); err != nil {
		b.Fatal(err)
	}
	p, err := openTxnProducer(context.Background(), benchProducerConfig(c.ListenAddrs()), "bench-raw")
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	rows := make([]outbox.Row, 1000)
	hs := outbox.EncodeHeaders([]outbox.Header{{Key: "type", Value: []byte("bench")}})
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		for txn := range benchRows / len(rows) {
			for i := range rows {
				id := int64(txn*len(rows) + i + 1)
				rows[i] = outbox.Row{ID: id, Feed: "bench", Epoch: "e1", Position: id, Topic: "bench",
					Key: []byte("key-" + strconv.Itoa(i%100)), Value: benchValue, Headers: hs}
			}
			msgs, err := messages(rows)
			if err != nil {
				b.Fatal(err)
			}
			if err := rawTxn(p, msgs); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*benchRows)/time.Since(start).Seconds(), "rows/s")
	b.ReportMetric(0, "ns/op")
}

// rawTxn is one transaction of the relay's producer.
func rawTxn(p *txnProducer, msgs []*record) error {
	return p.publishTxn(context.Background(), msgs)
}

// benchProducerConfig is DefaultConfig to brokers.
func benchProducerConfig(brokers []string) Config {
	cfg := DefaultConfig()
	cfg.Brokers = brokers
	return cfg
}
