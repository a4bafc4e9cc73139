package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkEncode is the exactly-once relay's encode path alone, with no
// broker's work in it: a transaction's 1000 outbox rows (100 keys, 100-byte
// values, one header of their own) made into records, sorted into their
// partitions' record batches, and written as one produce request to a
// connection that reads and drops the bytes (acks none, so nothing waits
// for an answer). Per row: ns/row, B/row (request bytes).
func BenchmarkEncode(b *testing.B) {
	c := newCluster(b)
	if err := c.CreateTopic("bench", 3, nil); err != nil {
		b.Fatal(err)
	}
	cfg := benchProducerConfig(c.ListenAddrs())
	p, err := openTxnProducer(context.Background(), cfg, "bench-encode")
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	sink, written := discardBroker(b)
	r := &Relay{cfg: cfg, refused: map[int64]bool{}}
	rows := make([]outbox.Row, 1000)
	hs := outbox.EncodeHeaders([]outbox.Header{{Key: "type", Value: []byte("bench")}})
	for i := range rows {
		id := int64(i + 1)
		rows[i] = outbox.Row{ID: id, Feed: "bench", Epoch: "e1", Position: id, Topic: "bench",
			Key: []byte("key-" + strconv.Itoa(i%100)), Value: benchValue, Headers: hs, CreatedAt: 1_700_000_000_000_000_000}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := encodeTxn(r, p, sink, rows); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	n := float64(b.N * len(rows))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/row")
	b.ReportMetric(float64(written.Load())/n, "B/row")
}

// encodeTxn is the encode path of one transaction of rows: their records,
// the batches, the produce request, its bytes sent.
func encodeTxn(r *Relay, p *txnProducer, sink *sarama.Broker, rows []outbox.Row) error {
	r.spare = r.spare.reuse(len(rows))
	recs, err := r.records(context.Background(), rows, r.spare)
	if err != nil {
		return err
	}
	if err := p.build(recs); err != nil {
		return err
	}
	return sendDropped(p, sink)
}

// sendDropped sends the transaction p built as one produce request that
// asks for no answer.
func sendDropped(p *txnProducer, sink *sarama.Broker) error {
	req := &sarama.ProduceRequest{TransactionalID: &p.txnID, RequiredAcks: sarama.NoResponse, Version: produceVersion}
	for _, pb := range p.parts {
		for _, bt := range pb.batches {
			req.AddBatch(pb.tp.topic, pb.tp.partition, bt)
		}
	}
	_, err := sink.Produce(req)
	return err
}

// discardBroker is a connection to a listener that reads every byte sent
// and drops it, counting them.
func discardBroker(tb testing.TB) (*sarama.Broker, *atomic.Int64) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	written := new(atomic.Int64)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = io.Copy(counter{written}, conn)
			}()
		}
	}()
	conf := sarama.NewConfig()
	conf.Version = sarama.V3_6_0_0
	conf.ApiVersionsRequest = false
	br := sarama.NewBroker(ln.Addr().String())
	if err := br.Open(conf); err != nil {
		tb.Fatal(err)
	}
	if _, err := br.Connected(); err != nil && !errors.Is(err, io.EOF) {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { br.Close() })
	return br, written
}

// counter counts the bytes written to it.
type counter struct{ n *atomic.Int64 }

func (c counter) Write(b []byte) (int, error) {
	c.n.Add(int64(len(b)))
	return len(b), nil
}
