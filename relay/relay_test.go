package relay

import (
	"bytes"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestRelay_Publish(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)

	// 350 rows over two topics: keyed ones, one with its own headers, one
	// with no key and one with no value.
	rows := keyed("orders", 300, 7, 0)
	rows[5].headers = []outbox.Header{{Key: "trace", Value: []byte("abc")}, {Key: "empty", Value: nil}}
	rows[6].key = nil
	rows[7].value = nil
	rows = append(rows, keyed("payments", 50, 3, 300)...)
	ids := emit(t, s, "feedA", rows[:200]...)
	cfg := testConfig(t, brokers)
	cfg.Batch = 64
	var txnRecords atomic.Int64
	cfg.OnTransaction = func(_ time.Duration, records int) { txnRecords.Add(int64(records)) }
	rr := startRelay(t, s, cfg)
	ids = append(ids, emit(t, s, "feedA", rows[200:]...)...)
	last := ids[len(ids)-1]
	rr.waitPublished(t, last)
	if got := txnRecords.Load(); got != int64(len(ids)) {
		t.Errorf("OnTransaction counted %d records, want %d", got, len(ids))
	}

	byID := map[int64]row{}
	for i, id := range ids {
		byID[id] = rows[i]
	}
	orders := readCommitted(t, brokers, "orders")
	payments := readCommitted(t, brokers, "payments")
	exactlyOnce(t, append(orders, payments...), ids)
	for _, r := range append(orders, payments...) {
		checkRecord(t, r, byID[idOf(t, r)], "feedA")
	}
	checkKeyOrder(t, orders)
	checkKeyOrder(t, payments)

	st := rr.r.Status()
	if st.State != StateIdle || !st.Connected || st.PublishedTotal != int64(len(ids)) || st.LastError != "" {
		t.Errorf("status %+v: want idle, connected, %d published, no error", st, len(ids))
	}
	wait(t, 5*time.Second, func() error {
		if p := rr.r.Status().Pending; p != 0 {
			return errors.New("pending " + strconv.FormatInt(p, 10))
		}
		return nil
	})
	waitSQLiteProgress(t, s, st.RelayID, last)
}

// checkRecord compares a record with the row it was published from.
func checkRecord(t *testing.T, r *kgo.Record, want row, feed string) {
	t.Helper()
	id := idOf(t, r)
	if r.Topic != want.topic || !bytes.Equal(r.Key, want.key) || !bytes.Equal(r.Value, want.value) {
		t.Errorf("row %d: got %s key %q value %q, want %s key %q value %q",
			id, r.Topic, r.Key, r.Value, want.topic, want.key, want.value)
	}
	if (r.Key == nil) != (want.key == nil) || (r.Value == nil) != (want.value == nil) {
		t.Errorf("row %d: nil key/value not kept: key %v value %v", id, r.Key == nil, r.Value == nil)
	}
	if len(r.Headers) != len(want.headers)+4 {
		t.Fatalf("row %d: %d headers, want %d: %v", id, len(r.Headers), len(want.headers)+4, r.Headers)
	}
	for i, h := range want.headers {
		if r.Headers[i].Key != h.Key || !bytes.Equal(r.Headers[i].Value, h.Value) {
			t.Errorf("row %d: header %d is %s=%q, want %s=%q", id, i, r.Headers[i].Key, r.Headers[i].Value, h.Key, h.Value)
		}
	}
	wantHeaders := map[string]string{HeaderFeed: feed, HeaderEpoch: "e1", HeaderPosition: strconv.FormatInt(id, 10)}
	for k, v := range wantHeaders {
		if got, _ := header(r, k); got != v {
			t.Errorf("row %d: header %s = %q, want %q", id, k, got, v)
		}
	}
	if want.key != nil {
		if p := javaPartition(want.key, 3); p != r.Partition {
			t.Errorf("row %d key %q: partition %d, the Java client picks %d", id, want.key, r.Partition, p)
		}
	}
}

// checkKeyOrder checks that a key's records are in one partition, in id order.
func checkKeyOrder(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	type last struct {
		partition int32
		offset    int64
		id        int64
	}
	seen := map[string]last{}
	for _, r := range recs {
		if r.Key == nil {
			continue
		}
		id := idOf(t, r)
		if l, ok := seen[string(r.Key)]; ok {
			if l.partition != r.Partition {
				t.Errorf("key %q in partitions %d and %d", r.Key, l.partition, r.Partition)
			} else if (r.Offset > l.offset) != (id > l.id) {
				t.Errorf("key %q: id %d at offset %d, id %d at offset %d", r.Key, l.id, l.offset, id, r.Offset)
			}
		}
		seen[string(r.Key)] = last{r.Partition, r.Offset, id}
	}
}

func TestRelay_MissingTopic(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.CreateTopics = false
	ids := emit(t, s, "f", keyed("absent", 5, 2, 0)...)
	rr := startRelay(t, s, cfg)
	wait(t, 10*time.Second, func() error {
		st := rr.r.Status()
		if st.State == StateBackingOff && st.LastError != "" && bytes.Contains([]byte(st.LastError), []byte(`"absent"`)) {
			return nil
		}
		return errors.New("status " + string(st.State) + ": " + st.LastError)
	})
	if n := countOutbox(t, s); n != 5 {
		t.Fatalf("outbox holds %d rows, want the 5 unpublished ones", n)
	}
	// Once an operator creates the topic, the relay goes on by itself.
	if err := c.CreateTopic("absent", 2, nil); err != nil {
		t.Fatal(err)
	}
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "absent"), ids)
}

func TestRelay_ShutdownIsPrompt(t *testing.T) {
	c := newCluster(t)
	s := outboxtest.TempStore(t)
	rr := startRelay(t, s, testConfig(t, c.ListenAddrs()))
	ids := emit(t, s, "f", keyed("t", 50, 5, 0)...)
	rr.waitPublished(t, ids[len(ids)-1])
	begin := time.Now()
	if err := rr.stop(t); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Run took %v to return", d)
	}
	if st := rr.r.Status(); st.State != StateStopped || st.Connected {
		t.Errorf("status after stop: %+v", st)
	}
}

func TestNew_InvalidConfig(t *testing.T) {
	s := outboxtest.TempStore(t)
	cfg := DefaultConfig()
	cfg.Mode = "twice"
	if _, err := New(s, cfg); err == nil {
		t.Fatal("New accepted mode twice")
	}
	if _, err := New(nil, DefaultConfig()); err == nil {
		t.Fatal("New accepted a nil store")
	}
}

// TestRelay_ShutdownMidStream stops the relay while it publishes a long
// backlog: Run returns promptly with the transaction in hand finished, and
// the next Run goes on exactly where it stopped.
func TestRelay_ShutdownMidStream(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("t", 20000, 10, 0)...)
	last := ids[len(ids)-1]
	cfg := testConfig(t, brokers)
	cfg.Batch = 50
	rr := startRelay(t, s, cfg)
	wait(t, 10*time.Second, func() error {
		if rr.r.Status().LastPublishedID == 0 {
			return errors.New("nothing published yet")
		}
		return nil
	})
	begin := time.Now()
	if err := rr.stop(t); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Run took %v to return", d)
	}
	stoppedAt := rr.r.Status().LastPublishedID
	if stoppedAt >= last {
		t.Logf("published everything (%d) before the stop took effect", stoppedAt)
	}
	waitSQLiteProgress(t, s, rr.r.Status().RelayID, stoppedAt)

	rr2 := startRelay(t, s, cfg)
	rr2.waitPublished(t, last)
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	if got := rr2.r.Status().PublishedTotal; got != last-stoppedAt {
		t.Errorf("the second Run published %d rows, want %d", got, last-stoppedAt)
	}
}
