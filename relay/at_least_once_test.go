package relay

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestAtLeastOnce_Publish(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.Mode = ModeAtLeastOnce
	ids := emit(t, s, "f", keyed("alo", 150, 5, 0)...)
	rr := startRelay(t, s, cfg)
	ids = append(ids, emit(t, s, "f", keyed("alo", 50, 5, 150)...)...)
	rr.waitPublished(t, ids[len(ids)-1])

	recs := readCommitted(t, brokers, "alo")
	exactlyOnce(t, recs, ids) // no failure happened, so no repeat either
	checkKeyOrder(t, recs)
	st := rr.r.Status()
	if st.Mode != ModeAtLeastOnce || st.TransactionalID != "" {
		t.Errorf("status %+v", st)
	}
	if got, _ := s.RelayProgress(context.Background(), st.RelayID); got != ids[len(ids)-1] {
		t.Errorf("SQLite progress %d, want %d", got, ids[len(ids)-1])
	}
	// No progress topic in this mode.
	if missing, err := newKafkaT(t, brokers).missingTopics(context.Background(), []string{DefaultProgressTopic}, "Read"); err != nil || len(missing) != 1 {
		t.Errorf("progress topic missing %v (%v), want it absent", missing, err)
	}
}

// TestAtLeastOnce_RepeatsOnlyUnmarked: rows acked but not marked (a crash
// between the two) are published again, and only those.
func TestAtLeastOnce_RepeatsOnlyUnmarked(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.Mode = ModeAtLeastOnce
	ids := emit(t, s, "f", keyed("alo", 100, 5, 0)...)
	rr := startRelay(t, s, cfg)
	rr.waitPublished(t, ids[len(ids)-1])
	relayID := rr.r.Status().RelayID
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtest.Exec(context.Background(), s, `UPDATE relay_progress SET last_id = 90 WHERE relay_id = ?`, relayID); err != nil {
		t.Fatal(err)
	}
	rr2 := startRelay(t, s, cfg)
	rr2.waitPublished(t, ids[len(ids)-1])
	recs := readCommitted(t, brokers, "alo")
	seen := map[int64]int{}
	for _, r := range recs {
		seen[idOf(t, r)]++
	}
	for _, id := range ids {
		want := 1
		if id > 90 {
			want = 2
		}
		if seen[id] != want {
			t.Errorf("row %d seen %d times, want %d", id, seen[id], want)
		}
	}
}

func newKafkaT(t *testing.T, brokers []string) *kafka {
	t.Helper()
	k, err := newKafka(brokers, kafkasec.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.close)
	return k
}
