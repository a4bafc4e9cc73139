//go:build stress

package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestProgress_RestartAfterMillionRows measures a restart after 1,000,000
// rows published in 100,000 transactions of 10 (the progress partition
// holds a record and a marker of each: half an hour of a relay at 50
// transactions a second): how long reading the relay's progress
// takes, against reading the whole partition as a restart did before, and
// the whole restart, from Run to publishing again. Figures only; run with
// go test -tags stress -run TestProgress_RestartAfterMillionRows -v ./relay/
func TestProgress_RestartAfterMillionRows(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	const rows, chunk = 1_000_000, 20_000
	var last int64
	for i := 0; i < rows; i += chunk {
		ids := emit(t, s, "f", keyed("t", chunk, 100, i)...)
		last = ids[len(ids)-1]
	}
	cfg := testConfig(t, brokers)
	cfg.Batch = 10
	started := time.Now()
	rr := startRelay(t, s, cfg)
	waitPublishedWithin(t, rr, last, 30*time.Minute)
	t.Logf("published %d rows in %d transactions in %v", rows, rr.r.Status().Transactions, time.Since(started))
	relayID := rr.r.Status().RelayID
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}

	k, err := newKafka(brokers, kafkasec.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer k.close()
	ctx := context.Background()
	pp, err := k.locateProgress(ctx, DefaultProgressTopic, relayID)
	if err != nil {
		t.Fatal(err)
	}
	end, err := k.listed(ctx, pp, kafkaclient.Latest, sarama.ReadUncommitted)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	p, found, err := k.readProgress(ctx, DefaultProgressTopic, relayID)
	tail := time.Since(t0)
	if err != nil || !found || p.LastID != last {
		t.Fatalf("progress %+v found %v: %v; want last id %d", p, found, err, last)
	}
	t0 = time.Now()
	var n int
	if err := k.fetchRange(ctx, pp, 0, end, func(kafkaclient.Record) { n++ }); err != nil {
		t.Fatal(err)
	}
	whole := time.Since(t0)
	t.Logf("progress partition: %d offsets, %d committed records; reading the relay's progress from the end: %v; "+
		"reading the whole partition (as before): %v", end, n, tail, whole)

	more := emit(t, s, "f", keyed("t", 10, 5, rows)...)
	t0 = time.Now()
	rr2 := startRelay(t, s, cfg)
	rr2.waitPublished(t, more[len(more)-1])
	t.Logf("restart to the next batch published: %v", time.Since(t0))
}

// waitPublishedWithin is waitPublished with a longer bound.
func waitPublishedWithin(t *testing.T, rr *running, id int64, d time.Duration) {
	t.Helper()
	wait(t, d, func() error {
		if got := rr.r.Status().LastPublishedID; got < id {
			return fmt.Errorf("published through %d, want %d", got, id)
		}
		return nil
	})
}
