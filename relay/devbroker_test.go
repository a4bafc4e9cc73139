package relay

import (
	"testing"

	"github.com/outboxd/outboxd/internal/devkafka"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestDevBroker_Relay runs the relay against the dev broker and reads the
// result back with an independent read_committed reader: every row once.
func TestDevBroker_Relay(t *testing.T) {
	b, err := devkafka.Start("127.0.0.1:0", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := devkafka.Start(b.Addr(), nil); err == nil {
		t.Fatal("a second dev broker on the same address started")
	}
	brokers := []string{b.Addr()}
	s := outboxtest.TempStore(t)
	ids := emit(t, s, "f", keyed("dev", 40, 4, 0)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "dev"), ids)
	// Reading the dev broker as `server consume` does is the server's
	// test (TestProduceConsume_DevBroker): relay may not import server.
}
