package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// wait is testutil.Wait.
var wait = testutil.Wait

// kafkaVersionEnv names, when set, the Kafka version whose request
// versions every test cluster is capped at ("2.8"): the suite run once so
// shows the relay works with a broker that old.
const kafkaVersionEnv = "RELAY_TEST_KAFKA"

// cappedVersions returns the request versions of the Kafka version named
// by kafkaVersionEnv, nil when it is not set.
func cappedVersions(tb testing.TB) *kversion.Versions {
	switch v := os.Getenv(kafkaVersionEnv); v {
	case "":
		return nil
	case "2.8":
		return kversion.V2_8_0()
	case "3.6":
		return kversion.V3_6_0()
	default:
		tb.Fatalf("%s=%q: want 2.8 or 3.6", kafkaVersionEnv, v)
		return nil
	}
}

func newCluster(tb testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	base := []kfake.Opt{kfake.NumBrokers(1)}
	if v := cappedVersions(tb); v != nil {
		base = append(base, kfake.MaxVersions(v))
	}
	c, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

func testLogger(tb testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("RELAY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: level}))
}

// testConfig is DefaultConfig with short waits, so failures recover fast.
func testConfig(tb testing.TB, brokers []string) Config {
	c := DefaultConfig()
	c.Brokers = brokers
	c.Batch = 100
	c.PollInterval = 50 * time.Millisecond
	c.MinBackoff = 20 * time.Millisecond
	c.MaxBackoff = 300 * time.Millisecond
	c.ShutdownTimeout = 5 * time.Second
	c.Logger = testLogger(tb)
	return c
}

// running is a relay whose Run goroutine the test controls.
type running struct {
	r      *Relay
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func startRelay(tb testing.TB, store *outbox.Store, cfg Config) *running {
	tb.Helper()
	r, err := New(store, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	tb.Cleanup(func() { rr.stop(tb) })
	return rr
}

// stop cancels Run and returns its error.
func (rr *running) stop(tb testing.TB) error {
	rr.once.Do(func() {
		rr.cancel()
		select {
		case rr.err = <-rr.done:
		case <-time.After(15 * time.Second):
			tb.Errorf("Run did not return within 15s of cancel")
		}
	})
	return rr.err
}

// waitPublished waits until the relay has published through id.
func (rr *running) waitPublished(tb testing.TB, id int64) {
	tb.Helper()
	wait(tb, 20*time.Second, func() error {
		s := rr.r.Status()
		if s.LastPublishedID >= id {
			return nil
		}
		return fmt.Errorf("published through %d, want %d (state %s, error %q)", s.LastPublishedID, id, s.State, s.LastError)
	})
}

// row describes an output to emit.
type row struct {
	topic   string
	key     []byte
	value   []byte
	headers []outbox.Header
}

// emit writes rows in one ingest transaction, one item per row, and
// returns their ids.
func emit(tb testing.TB, s *outbox.Store, feed string, rows ...row) []int64 {
	tb.Helper()
	ctx := context.Background()
	before, err := s.LastOutboxID(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback()
	for i, r := range rows {
		p := outbox.Place{Feed: feed, Partition: 0, Epoch: "e1", Position: before + int64(i) + 1}
		if err := tx.BeginItem(p); err != nil {
			tb.Fatal(err)
		}
		if err := tx.Emit(ctx, outbox.Output{Topic: r.topic, Key: r.key, Value: r.value, Headers: r.headers}); err != nil {
			tb.Fatal(err)
		}
		if err := tx.EndItem(); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
	ids := make([]int64, len(rows))
	for i := range rows {
		ids[i] = before + int64(i) + 1
	}
	return ids
}

// keyed makes n rows on topic with keys k0..k(keys-1) in turn and values
// v<start+i>.
func keyed(topic string, n, keys, start int) []row {
	rows := make([]row, n)
	for i := range rows {
		rows[i] = row{
			topic: topic,
			key:   []byte("k" + strconv.Itoa(i%keys)),
			value: []byte("v" + strconv.Itoa(start+i)),
		}
	}
	return rows
}

// readCommitted returns every committed record of topic, reading with
// read_committed until each partition's high watermark is reached, so the
// count is exact: nothing committed is missed, nothing is counted twice.
func readCommitted(tb testing.TB, brokers []string, topic string, opts ...kgo.Opt) []*kgo.Record {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ends := endOffsets(tb, ctx, brokers, topic, opts...)
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), // lets us see the offset at the end of each partition
	}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	next := map[int32]int64{}
	var recs []*kgo.Record
	for !reached(next, ends) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			tb.Fatalf("reading %s: positions %v, want %v: %v", topic, next, ends, ctx.Err())
		}
		fs.EachError(func(t string, p int32, err error) { tb.Logf("fetch %s[%d]: %v", t, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			next[r.Partition] = r.Offset + 1
			if !r.Attrs.IsControl() {
				recs = append(recs, r)
			}
		})
	}
	return recs
}

func reached(next, ends map[int32]int64) bool {
	for p, end := range ends {
		if next[p] < end {
			return false
		}
	}
	return true
}

// endOffsets waits until no transaction is open on topic and returns its
// partitions' high watermarks.
func endOffsets(tb testing.TB, ctx context.Context, brokers []string, topic string, opts ...kgo.Opt) map[int32]int64 {
	tb.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends := map[int32]int64{}
	wait(tb, 10*time.Second, func() error {
		hwm, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return err
		}
		lso, err := adm.ListCommittedOffsets(ctx, topic)
		if err != nil {
			return err
		}
		var open error
		hwm.Each(func(o kadm.ListedOffset) {
			ends[o.Partition] = o.Offset
			if l, ok := lso.Lookup(topic, o.Partition); !ok || l.Offset < o.Offset {
				open = fmt.Errorf("%s[%d]: a transaction is open below %d", topic, o.Partition, o.Offset)
			}
		})
		if len(ends) == 0 {
			return errors.New("no partitions listed for " + topic)
		}
		return open
	})
	return ends
}

// header returns the last value of header key.
func header(r *kgo.Record, key string) (string, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return string(r.Headers[i].Value), true
		}
	}
	return "", false
}

// idOf returns a record's outboxd-id header.
func idOf(tb testing.TB, r *kgo.Record) int64 {
	tb.Helper()
	v, ok := header(r, HeaderID)
	if !ok {
		tb.Fatalf("record %s[%d]@%d has no %s header", r.Topic, r.Partition, r.Offset, HeaderID)
	}
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// exactlyOnce checks that recs hold each id in want exactly once.
func exactlyOnce(tb testing.TB, recs []*kgo.Record, want []int64) {
	tb.Helper()
	seen := map[int64]int{}
	for _, r := range recs {
		seen[idOf(tb, r)]++
	}
	for _, id := range want {
		if seen[id] != 1 {
			tb.Errorf("outbox row %d seen %d times, want once", id, seen[id])
		}
		delete(seen, id)
	}
	for id, n := range seen {
		tb.Errorf("unexpected outbox row %d seen %d times", id, n)
	}
	if len(recs) != len(want) {
		tb.Errorf("read %d records, want %d", len(recs), len(want))
	}
}

func seq(from, to int64) []int64 {
	var ids []int64
	for id := from; id <= to; id++ {
		ids = append(ids, id)
	}
	return ids
}

func countOutbox(tb testing.TB, s *outbox.Store) int {
	tb.Helper()
	var n int
	if err := outboxtest.Get(context.Background(), s, &n, `SELECT count(*) FROM outbox`); err != nil {
		tb.Fatal(err)
	}
	return n
}

// waitSQLiteProgress waits until SQLite's progress for relayID is want:
// exactly-once progress reaches SQLite just after the Kafka commit.
func waitSQLiteProgress(tb testing.TB, s *outbox.Store, relayID string, want int64) {
	tb.Helper()
	wait(tb, 5*time.Second, func() error {
		got, err := s.RelayProgress(context.Background(), relayID)
		if err != nil || got != want {
			return fmt.Errorf("SQLite progress %d (%v), want %d", got, err, want)
		}
		return nil
	})
}
