package relay

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// producerMessages is recs as sarama's own producer takes them, for a test
// that produces the relay's records with it.
func producerMessages(recs []*record) []*sarama.ProducerMessage {
	ms := make([]*sarama.ProducerMessage, len(recs))
	for i, r := range recs {
		m := &sarama.ProducerMessage{Topic: r.topic, Timestamp: time.UnixMilli(r.at)}
		if r.rec.Key != nil {
			m.Key = sarama.ByteEncoder(r.rec.Key)
		}
		if r.rec.Value != nil {
			m.Value = sarama.ByteEncoder(r.rec.Value)
		}
		for _, h := range r.rec.Headers {
			m.Headers = append(m.Headers, *h)
		}
		ms[i] = m
	}
	return ms
}

// variedRows are outputs of every shape a record takes: empty and nil
// keys and values, many headers, outboxd-* headers of the row's own,
// unicode, a large value.
func variedRows() []row {
	many := make([]outbox.Header, 40)
	for i := range many {
		many[i] = outbox.Header{Key: "h" + strconv.Itoa(i), Value: []byte(strings.Repeat("x", i))}
	}
	return []row{
		{topic: "varied", key: []byte("k"), value: []byte("v")},
		{topic: "varied", key: []byte{}, value: []byte("empty key")},
		{topic: "varied", key: nil, value: []byte("nil key")},
		{topic: "varied", key: []byte("nil value"), value: nil},
		{topic: "varied", key: []byte("empty value"), value: []byte{}},
		{topic: "varied", key: nil, value: nil},
		{topic: "varied", key: []byte("many"), value: []byte("headers"), headers: many},
		{topic: "varied", key: []byte("ключ-キー-🔑"), value: []byte("значение · 値 · ✓"),
			headers: []outbox.Header{{Key: "ünï", Value: []byte("çødé")}, {Key: "empty", Value: nil}}},
		{topic: "varied", key: []byte("large"), value: bytes.Repeat([]byte("0123456789"), 30_000)},
		{topic: "varied", key: []byte("own"), value: []byte("outboxd headers"), headers: []outbox.Header{
			{Key: HeaderID, Value: []byte("7")}, {Key: "outboxd-reason", Value: []byte("old")},
			{Key: "k", Value: []byte("v")}, {Key: "outboxd-reason", Value: []byte("new")}}},
		{topic: "other", key: []byte("k"), value: []byte("second topic")},
	}
}

// viaProducerMessage is the record the relay made of r before its records
// went straight into batches: r as a sarama.ProducerMessage, then that
// message's record as the producer encoded it, with the message's size.
func viaProducerMessage(t *testing.T, r *outbox.Row) (*sarama.ProducerMessage, sarama.Record, int) {
	t.Helper()
	hs, err := outbox.DecodeHeaders(r.Headers)
	if err != nil {
		t.Fatal(err)
	}
	m := &sarama.ProducerMessage{Topic: r.Topic, Timestamp: time.Unix(0, r.CreatedAt),
		Headers: append(appendRowHeaders(nil, hs),
			sarama.RecordHeader{Key: []byte(HeaderID), Value: []byte(strconv.FormatInt(r.ID, 10))},
			sarama.RecordHeader{Key: []byte(HeaderFeed), Value: []byte(r.Feed)},
			sarama.RecordHeader{Key: []byte(HeaderEpoch), Value: []byte(r.Epoch)},
			sarama.RecordHeader{Key: []byte(HeaderPosition), Value: []byte(strconv.FormatInt(r.Position, 10))})}
	if r.Key != nil {
		m.Key = sarama.ByteEncoder(r.Key)
	}
	if r.Value != nil {
		m.Value = sarama.ByteEncoder(r.Value)
	}
	var rec sarama.Record
	if m.Key != nil {
		rec.Key, _ = m.Key.Encode()
	}
	if m.Value != nil {
		rec.Value, _ = m.Value.Encode()
	}
	for i := range m.Headers {
		rec.Headers = append(rec.Headers, &m.Headers[i])
	}
	return m, rec, m.ByteSize(2)
}

// TestRecords_AsBefore: the records made straight from rows are those the
// rows' ProducerMessages made: the same key and value (nil kept nil), the
// same headers in order, the same timestamp to the millisecond, the same
// size, and the same partition.
func TestRecords_AsBefore(t *testing.T) {
	var rows []outbox.Row
	for i, v := range variedRows() {
		id := int64(100 + i)
		rows = append(rows, outbox.Row{ID: id, Feed: "fééd", Epoch: "e1", Position: 4096 * id, Topic: v.topic,
			Key: v.key, Value: v.value, Headers: outbox.EncodeHeaders(v.headers),
			CreatedAt: 1_700_000_000_123_456_789 + int64(i)*1_999_999})
	}
	recs, err := newRecordSlab(len(rows)).messages(rows)
	if err != nil {
		t.Fatal(err)
	}
	p := &txnProducer{conf: saramaConfig(DefaultConfig(), ""), partitioners: map[string]sarama.Partitioner{}}
	for i, got := range recs {
		r := &rows[i]
		m, want, size := viaProducerMessage(t, r)
		if got.topic != m.Topic || got.size != size || got.at != m.Timestamp.Truncate(time.Millisecond).UnixMilli() {
			t.Errorf("row %d: topic %s size %d at %d, want %s %d %d", r.ID, got.topic, got.size, got.at,
				m.Topic, size, m.Timestamp.UnixMilli())
		}
		if !bytes.Equal(got.rec.Key, want.Key) || (got.rec.Key == nil) != (want.Key == nil) ||
			!bytes.Equal(got.rec.Value, want.Value) || (got.rec.Value == nil) != (want.Value == nil) {
			t.Errorf("row %d: key %q (nil %v) value of %d (nil %v), want %q (nil %v), %d (nil %v)", r.ID,
				got.rec.Key, got.rec.Key == nil, len(got.rec.Value), got.rec.Value == nil,
				want.Key, want.Key == nil, len(want.Value), want.Value == nil)
		}
		if g, w := headerList(got.rec.Headers), headerList(want.Headers); g != w {
			t.Errorf("row %d: headers\n got %s\nwant %s", r.ID, g, w)
		}
		if r.Key == nil {
			continue // spread at random
		}
		for _, n := range []int32{1, 3, 16} {
			gotP, err := p.partition(p.conf.Producer.Partitioner(r.Topic), got, n)
			if err != nil {
				t.Fatal(err)
			}
			wantP, err := p.conf.Producer.Partitioner(r.Topic).Partition(m, n)
			if err != nil {
				t.Fatal(err)
			}
			if gotP != wantP {
				t.Errorf("row %d of %d partitions: partition %d, the message's %d", r.ID, n, gotP, wantP)
			}
		}
	}
}

func headerList(hs []*sarama.RecordHeader) string {
	var b strings.Builder
	for _, h := range hs {
		fmt.Fprintf(&b, "%q=%q(nil %v) ", h.Key, h.Value, h.Value == nil)
	}
	return b.String()
}

// TestRecords_ReadCommitted: what a read_committed reader sees of varied
// rows, in both modes, is each row's key and value (nil kept nil), its
// headers then the relay's four, and its creation time to the millisecond
// (Config.Timestamp created).
func TestRecords_ReadCommitted(t *testing.T) {
	for _, mode := range []Mode{ModeExactlyOnce, ModeAtLeastOnce} {
		t.Run(string(mode), func(t *testing.T) {
			c := newCluster(t)
			brokers := c.ListenAddrs()
			for _, topic := range []string{"varied", "other"} {
				if err := c.CreateTopic(topic, 3, nil); err != nil {
					t.Fatal(err)
				}
			}
			s := outboxtest.TempStore(t)
			vs := variedRows()
			ids := emit(t, s, "feedV", vs...)
			cfg := testConfig(t, brokers)
			cfg.Mode = mode
			cfg.Timestamp = TimestampCreated
			cfg.MaxMessageBytes = 1 << 20
			rr := startRelay(t, s, cfg)
			rr.waitPublished(t, ids[len(ids)-1])
			rows, err := s.Rows(context.Background(), ids[0]-1, len(ids))
			if err != nil || len(rows) != len(ids) {
				t.Fatalf("%d rows, %v", len(rows), err)
			}
			got := append(readCommitted(t, brokers, "varied"), readCommitted(t, brokers, "other")...)
			if len(got) != len(ids) {
				t.Fatalf("%d records, want %d", len(got), len(ids))
			}
			byID := map[int64]*kgo.Record{}
			for _, r := range got {
				byID[idOf(t, r)] = r
			}
			for i, id := range ids {
				r, row := byID[id], &rows[i]
				if r == nil {
					t.Fatalf("row %d not read", id)
				}
				_, want, _ := viaProducerMessage(t, row)
				if r.Topic != row.Topic || !bytes.Equal(r.Key, want.Key) || (r.Key == nil) != (want.Key == nil) ||
					!bytes.Equal(r.Value, want.Value) || (r.Value == nil) != (want.Value == nil) {
					t.Errorf("row %d: %s key %q (nil %v) value of %d (nil %v), want %s %q (nil %v), %d (nil %v)", id,
						r.Topic, r.Key, r.Key == nil, len(r.Value), r.Value == nil,
						row.Topic, want.Key, want.Key == nil, len(want.Value), want.Value == nil)
				}
				var hs []*sarama.RecordHeader
				for _, h := range r.Headers {
					hs = append(hs, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
				}
				if g, w := headerList(hs), headerList(want.Headers); g != w {
					t.Errorf("row %d: headers\n got %s\nwant %s", id, g, w)
				}
				if at := time.Unix(0, row.CreatedAt).UnixMilli(); r.Timestamp.UnixMilli() != at {
					t.Errorf("row %d: timestamp %d, want %d", id, r.Timestamp.UnixMilli(), at)
				}
			}
		})
	}
}
