package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestProgressTopic_Settings: the relay creates the progress topic with
// segments that roll soon (so compaction can keep it short) and the
// broker's compaction settings it knows; on a topic made without them it
// warns once, naming the command that sets them, and publishes anyway.
func TestProgressTopic_Settings(t *testing.T) {
	t.Run("Created", func(t *testing.T) {
		c := newCluster(t)
		brokers := c.ListenAddrs()
		s := outboxtest.TempStore(t)
		ids := emit(t, s, "f", keyed("t", 20, 2, 0)...)
		var logs testutil.SyncBuffer
		cfg := testConfig(t, brokers)
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		rr := startRelay(t, s, cfg)
		rr.waitPublished(t, ids[len(ids)-1])
		got := describeTopic(t, brokers, DefaultProgressTopic)
		for k, want := range map[string]string{"cleanup.policy": "compact", "segment.ms": "600000", "segment.bytes": "16777216"} {
			if got[k] != want {
				t.Errorf("progress topic %s = %q, want %q", k, got[k], want)
			}
		}
		if strings.Contains(logs.String(), "lacks the settings") {
			t.Errorf("a warning for the topic the relay made: %s", logs.String())
		}
	})
	t.Run("Existing", func(t *testing.T) {
		c := newCluster(t)
		if err := c.CreateTopic(DefaultProgressTopic, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
			t.Fatal(err)
		}
		brokers := c.ListenAddrs()
		s := outboxtest.TempStore(t)
		ids := emit(t, s, "f", keyed("t", 20, 2, 0)...)
		var logs testutil.SyncBuffer
		cfg := testConfig(t, brokers)
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		rr := startRelay(t, s, cfg)
		rr.waitPublished(t, ids[len(ids)-1])
		// A second session checks nothing again.
		c.ShufflePartitionLeaders()
		ids = append(ids, emit(t, s, "f", keyed("t", 20, 2, 20)...)...)
		rr.waitPublished(t, ids[len(ids)-1])
		exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
		out := logs.String()
		want := "--entity-name " + DefaultProgressTopic + " --add-config segment.ms=600000,segment.bytes=16777216"
		if n := strings.Count(out, "lacks the settings"); n != 1 || !strings.Contains(out, want) {
			t.Errorf("%d warnings, want one saying %q:\n%s", n, want, out)
		}
	})
}

// describeTopic returns topic's settings.
func describeTopic(t *testing.T, brokers []string, topic string) map[string]string {
	t.Helper()
	k, err := newKafka(brokers, kafkasec.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer k.close()
	got, err := k.topicConfigs(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestProgress_RestartNotHeldByAnotherRelay: another database's relay
// died mid-transaction on the shared progress partition, its transaction
// timeout a minute away. A relay restarting meanwhile reads its own last
// committed progress and goes on at once, without waiting for the last
// stable offset the open transaction holds back; it publishes each row
// once.
func TestProgress_RestartNotHeldByAnotherRelay(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("t", 50, 5, 0)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}

	// The other relay: a progress record of its own id in a transaction
	// it never ends.
	zc := saramaConfig(testConfig(t, brokers), "outboxd-other")
	zc.Producer.Return.Successes = true
	zc.Producer.Transaction.Timeout = time.Minute
	zombie, err := sarama.NewAsyncProducer(brokers, zc)
	if err != nil {
		t.Fatal(err)
	}
	defer zombie.Close()
	if err := zombie.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	zombie.Input() <- &sarama.ProducerMessage{Topic: DefaultProgressTopic, Key: sarama.StringEncoder("other"),
		Value: sarama.StringEncoder(`{"lastId":7}`)}
	select {
	case <-zombie.Successes():
	case err := <-zombie.Errors():
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the other relay's record was not written")
	}

	ids = append(ids, emit(t, s, "f", keyed("t", 30, 5, 50)...)...)
	started := time.Now()
	rr2 := startRelay(t, s, testConfig(t, brokers))
	rr2.waitPublished(t, ids[len(ids)-1])
	if d := time.Since(started); d > 20*time.Second {
		t.Errorf("the restart took %v", d)
	}
	if st := rr2.r.Status(); st.PublishedTotal != 30 {
		t.Errorf("the restarted relay published %d rows, want the 30 new ones", st.PublishedTotal)
	}
	exactlyOnce(t, readCommitted(t, brokers, "t"), ids)
}
