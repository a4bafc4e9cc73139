package relay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// lastProgress reads the relay's committed progress record from Kafka.
func lastProgress(t *testing.T, brokers []string, relayID string) (Progress, bool) {
	t.Helper()
	k, err := newKafka(brokers, kafkasec.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer k.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, found, err := k.readProgress(ctx, DefaultProgressTopic, relayID)
	if err != nil {
		t.Fatal(err)
	}
	return p, found
}

func TestProgress_WrittenToKafkaAndSQLite(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	rows := keyed("t", 30, 3, 0)
	rows[29].topic = "u"
	ids := emit(t, s, "feedP", rows...)
	rr := startRelay(t, s, testConfig(t, brokers))
	last := ids[len(ids)-1]
	rr.waitPublished(t, last)
	relayID := rr.r.Status().RelayID

	p, found := lastProgress(t, brokers, relayID)
	host, _ := os.Hostname()
	want := Progress{LastID: last, Feed: "feedP", Partition: 0, Epoch: "e1", Position: last, N: 0,
		Path: s.AbsPath(), Host: host, At: p.At}
	if since := time.Since(time.UnixMilli(p.At)); since < 0 || since > time.Minute {
		t.Fatalf("progress record at %v (%v ago), want the time it was written", time.UnixMilli(p.At), since)
	}
	if !found || p != want {
		t.Fatalf("Kafka progress %+v (found %v), want %+v", p, found, want)
	}
	waitSQLiteProgress(t, s, relayID, last)
	// One progress record per transaction, all read_committed, all keyed
	// by the relay id, ids increasing.
	recs := readCommitted(t, brokers, DefaultProgressTopic)
	if len(recs) == 0 || int64(len(recs)) != rr.r.Status().Transactions {
		t.Fatalf("%d progress records for %d transactions", len(recs), rr.r.Status().Transactions)
	}
	var prev int64
	for _, r := range recs {
		p, err := DecodeProgress(r.Value)
		if err != nil || string(r.Key) != relayID || p.LastID <= prev {
			t.Fatalf("progress record %s = %s (%v), previous id %d", r.Key, r.Value, err, prev)
		}
		prev = p.LastID
	}
}

// TestProgress_ResumeAfterKafkaWhenSQLiteLags is a crash between the Kafka
// commit and the SQLite write: SQLite's progress lags Kafka's, and the
// restarted relay must go on after Kafka's without publishing twice.
func TestProgress_ResumeAfterKafkaWhenSQLiteLags(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("t", 120, 4, 0)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	relayID := rr.r.Status().RelayID
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtest.Exec(context.Background(), s, `UPDATE relay_progress SET last_id = 10 WHERE relay_id = ?`, relayID); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, emit(t, s, "f", keyed("t", 30, 4, 120)...)...)

	rr2 := startRelay(t, s, testConfig(t, brokers))
	rr2.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	if st := rr2.r.Status(); st.PublishedTotal != 30 {
		t.Errorf("the restarted relay published %d rows, want the 30 new ones", st.PublishedTotal)
	}
	waitSQLiteProgress(t, s, relayID, ids[len(ids)-1])
}

// TestProgress_ResumeAfterSQLiteWhenKafkaLags: with no progress in Kafka
// (a recreated progress topic, a switch from at-least-once), SQLite's
// progress is where the relay goes on.
func TestProgress_ResumeAfterSQLiteWhenKafkaLags(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	emit(t, s, "f", keyed("t", 40, 4, 0)...)
	relayID, err := s.MetaID(context.Background(), relayIDKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetRelayProgress(context.Background(), relayID, 40); err != nil {
		t.Fatal(err)
	}
	ids := emit(t, s, "f", keyed("t", 10, 4, 40)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
}

// TestProgress_DanglingTransactionAborted: a relay killed mid-transaction
// leaves it open; the next relay's producer aborts it, and a
// read_committed consumer never sees its records.
func TestProgress_DanglingTransactionAborted(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("t", 50, 5, 0)...)
	relayID, err := s.MetaID(context.Background(), relayIDKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, brokers)
	for _, topic := range []string{"t", DefaultProgressTopic} {
		if err := c.CreateTopic(topic, 3, nil); err != nil {
			t.Fatal(err)
		}
	}

	// The "dead" relay: rows 1..50 and a progress record for 50, never
	// committed, producer never closed.
	zc := saramaConfig(cfg, "outboxd-"+relayID)
	zc.Producer.Return.Successes = true // to know every record is in the open transaction
	zombie, err := sarama.NewAsyncProducer(brokers, zc)
	if err != nil {
		t.Fatal(err)
	}
	if err := zombie.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	rows, _ := s.Rows(context.Background(), 0, 100)
	recs, _ := messages(rows)
	pm, _ := progressRecord(DefaultProgressTopic, relayID, progressOf(&rows[len(rows)-1]))
	msgs := producerMessages(recs)
	for _, m := range append(msgs, producerMessages([]*record{pm})...) {
		zombie.Input() <- m
	}
	for range len(msgs) + 1 {
		select {
		case <-zombie.Successes():
		case e := <-zombie.Errors():
			t.Fatal(e)
		}
	}
	t.Cleanup(func() { zombie.AsyncClose() })

	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
	if st := rr.r.Status(); st.PublishedTotal != 50 {
		t.Errorf("published %d rows, want all 50 (the open transaction does not count)", st.PublishedTotal)
	}
}

func TestRelay_RefusesWhenDatabaseWentBackInTime(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	dir := t.TempDir()
	s := outboxtest.StoreAt(t, filepath.Join(dir, "live.db"))
	ids := emit(t, s, "f", keyed("t", 20, 2, 0)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	relayID := rr.r.Status().RelayID
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}

	t.Run("KafkaAheadOfLastID", func(t *testing.T) {
		// A copy from before rows 6..20 existed.
		old := restoredStore(t, filepath.Join(dir, "old.db"), relayID, keyed("t", 5, 2, 0))
		refused(t, old, brokers, "20", "5")
	})
	t.Run("RowIsAnotherOne", func(t *testing.T) {
		// A copy whose ingest went on differently: row 20 exists, but it
		// is not the row that was published as 20.
		other := restoredStore(t, filepath.Join(dir, "other.db"), relayID, keyed("t", 25, 2, 0))
		if _, err := outboxtest.Exec(context.Background(), other,
			`UPDATE outbox_chunks SET epoch = 'another' WHERE last_id >= 20 AND last_id - count < 20`); err != nil {
			t.Fatal(err)
		}
		refused(t, other, brokers, "row 20")
	})
	if recs := readCommitted(t, brokers, "t"); len(recs) != 20 {
		t.Errorf("%d records on the topic, want only the 20 published before", len(recs))
	}
}

// restoredStore makes a database with the live one's relay id and rows.
func restoredStore(t *testing.T, path, relayID string, rows []row) *outbox.Store {
	t.Helper()
	s := outboxtest.StoreAt(t, path)
	if _, err := outboxtest.Exec(context.Background(), s, `INSERT INTO meta (key, value) VALUES (?, ?)`, relayIDKey, relayID); err != nil {
		t.Fatal(err)
	}
	emit(t, s, "f", rows...)
	return s
}

// refused runs a relay on s and checks that it refuses, saying why.
func refused(t *testing.T, s *outbox.Store, brokers []string, says ...string) {
	t.Helper()
	r, err := New(s, testConfig(t, brokers))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if !errors.Is(err, ErrBackInTime) {
		t.Fatalf("Run returned %v, want ErrBackInTime", err)
	}
	st := r.Status()
	if st.State != StateRefusing || st.PublishedTotal != 0 {
		t.Errorf("status %+v, want refusing with nothing published", st)
	}
	for _, w := range says {
		if !strings.Contains(st.LastError, w) {
			t.Errorf("status error %q does not say %q", st.LastError, w)
		}
	}
}

// TestRelayRows_MatchesRows: the relay's fast reader returns what
// Store.Rows does, NULLs included.
func TestRelayRows_MatchesRows(t *testing.T) {
	s := outboxtest.TempStore(t)
	rows := keyed("t", 50, 5, 0)
	rows[3].key, rows[4].value = nil, nil
	rows[5].headers = []outbox.Header{{Key: "a", Value: []byte("b")}}
	emit(t, s, "f", rows...)
	ctx := context.Background()
	for _, after := range []int64{0, 10, 49, 50} {
		want, err := s.Rows(ctx, after, 20)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.RelayRows(ctx, after, 20)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after %d: RelayRows %+v, Rows %+v", after, got, want)
		}
	}
}
