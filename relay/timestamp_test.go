package relay

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// tooOld makes c refuse, as a broker with log.message.timestamp.before.max.ms
// does, a produce holding a record batch whose first timestamp is older
// than limit: INVALID_TIMESTAMP for each partition of the request.
func tooOld(c *kfake.Cluster, limit time.Duration) *kfake.FaultHandle {
	return c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.InvalidTimestamp, Count: -1,
		When: func(req kmsg.Request) bool {
			oldest := time.Now().Add(-limit).UnixMilli()
			for _, rt := range req.(*kmsg.ProduceRequest).Topics {
				if rt.Topic == DefaultProgressTopic {
					continue
				}
				for _, rp := range rt.Partitions {
					for _, ts := range timestamps(rp.Records) {
						if ts < oldest {
							return true
						}
					}
				}
			}
			return false
		}})
}

// TestRelay_Timestamp: a backlog of rows created two days ago, behind a
// broker that refuses records older than a day. Stamped with their publish
// time (the default) every row is published, its record as new as its
// publishing; stamped with their creation, the old rows are refused with
// INVALID_TIMESTAMP, and each becomes a dead letter, once, while the new
// rows among them are published: nothing loops, nothing is lost.
func TestRelay_Timestamp(t *testing.T) {
	for _, mode := range []Mode{ModeExactlyOnce, ModeAtLeastOnce} {
		for _, stamp := range []string{TimestampPublish, TimestampCreated} {
			t.Run(string(mode)+"/"+stamp, func(t *testing.T) {
				c := newCluster(t)
				tooOld(c, 24*time.Hour)
				brokers := c.ListenAddrs()
				var age atomic.Int64 // how far behind the store's clock is
				cfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "outboxd.db"))
				cfg.Now = func() time.Time { return time.Now().Add(-time.Duration(age.Load())) }
				s := outboxtest.OpenStore(t, cfg)
				var rows []row
				var ids []int64
				old := map[int]bool{}
				for i := range 6 {
					if i%2 == 0 {
						age.Store(int64(48 * time.Hour))
					} else {
						age.Store(0)
					}
					part := keyed("t", 10, 3, 10*i)
					for j := range part {
						old[len(rows)+j] = i%2 == 0
					}
					rows = append(rows, part...)
					ids = append(ids, emit(t, s, "f", part...)...)
				}
				rcfg := testConfig(t, brokers)
				rcfg.Mode, rcfg.Timestamp = mode, stamp
				started := time.Now()
				rr := startRelay(t, s, rcfg)
				rr.waitPublished(t, ids[len(ids)-1])
				recs := readCommitted(t, brokers, "t")
				if stamp == TimestampPublish {
					all, _ := split(ids, rows, nil)
					published(t, mode, recs, all)
					for _, r := range recs {
						if r.Timestamp.Before(started.Truncate(time.Millisecond)) {
							t.Errorf("record of row %d stamped %v, before the relay started (%v)", idOf(t, r), r.Timestamp, started)
						}
					}
					ds, err := s.DeadLetters(context.Background(), "f", 0, 10)
					if err != nil || len(ds) != 0 || rr.r.Status().DeadLettered != 0 {
						t.Errorf("%d dead letters (%v), status counts %d; want none", len(ds), err, rr.r.Status().DeadLettered)
					}
					return
				}
				pub, dead := split(ids, rows, old)
				published(t, mode, recs, pub)
				deadLetteredAs(t, s, dead, ReasonOutputInvalidTimestamp, "for its timestamp (--relay-timestamp created")
				for _, r := range recs {
					if time.Since(r.Timestamp) > time.Hour {
						t.Errorf("record of row %d stamped %v: a new row's creation, want within the hour", idOf(t, r), r.Timestamp)
					}
				}
				if st := rr.r.Status(); st.DeadLettered != int64(len(dead)) || st.PublishedTotal < int64(len(pub)) {
					t.Errorf("status: %d dead-lettered, %d published; want %d, %d", st.DeadLettered, st.PublishedTotal, len(dead), len(pub))
				}
			})
		}
	}
}

// timestamps returns the timestamps (Unix milliseconds) of the records in
// a produced record batch.
func timestamps(batch []byte) []int64 {
	var b kmsg.RecordBatch
	if b.ReadFrom(batch) != nil {
		return nil
	}
	raw, err := kgo.DefaultDecompressor().Decompress(b.Records, kgo.CompressionCodecType(b.Attributes&7))
	if err != nil {
		return nil
	}
	var ts []int64
	for range b.NumRecords {
		n, size := binary.Varint(raw)
		if size <= 0 || int(n)+size > len(raw) {
			return ts
		}
		var r kmsg.Record
		if r.ReadFrom(raw[:size+int(n)]) != nil {
			return ts
		}
		ts = append(ts, b.FirstTimestamp+r.TimestampDelta64)
		raw = raw[size+int(n):]
	}
	return ts
}
