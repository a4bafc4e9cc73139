package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/internal/testutil/natstest"
)

// TestSinkNATS_KillNine: 20,000 ledger lines relayed to JetStream alone
// (the Kafka relay off) while the server is killed with SIGKILL 10 times
// at random moments: every output, and every dead letter's copy, is in
// the stream exactly once, in outbox id order per subject, with the
// balances right; the feed is lossless; the sink's progress is the last
// outbox id.
func TestSinkNATS_KillNine(t *testing.T) {
	srv := natstest.Start(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 29))
	lf := makeLedger(rng, 20_000)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(cfg, []byte(`sinks:
  - name: js
    url: `+srv.URL()+`
    options: {stream: LEDGER, timeout: 2s}
    topics:
      ledger.out: {}
      ledger.dlq: {subject: ledger.dead}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "ledger.csv")
	db := filepath.Join(dir, "outboxd.db")
	args := []string{"--config", cfg, "--db", db, "--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--http", "127.0.0.1:0", "--relay", "none", "--outbox-retention", "0"}
	writing := appendSlowly(t, input, lf.data, 6*time.Second, rng)
	for range 10 {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(30+rng.IntN(400)) * time.Millisecond) // a random moment to crash at
		p.kill()
	}
	<-writing
	p := start(t, nil, args...)
	s := readStore(t, db)
	ctx := context.Background()
	wait(t, 90*time.Second, func() error {
		cps, err := s.ReadPositions(ctx, "ledger")
		if err != nil || len(cps) == 0 || cps[0].Position != int64(len(lf.data)) {
			return fmt.Errorf("stored position %v (%v), want %d", cps, err, len(lf.data))
		}
		last, err := s.LastOutboxID(ctx)
		if err != nil {
			return err
		}
		done, err := s.SinkProgress(ctx, "js")
		if err != nil || done != last {
			return fmt.Errorf("sink progress %d (%v), want %d", done, err, last)
		}
		return nil
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	f, err := s.Feed(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if !f.Lossless {
		t.Fatalf("feed not lossless: %+v", f)
	}

	out, dlq := readStream(t, srv.URL(), "LEDGER")
	var outPos, dlqPos []int64
	for _, c := range out {
		outPos = append(outPos, atoi64(c.Headers["outboxd-position"]))
	}
	for _, c := range dlq {
		dlqPos = append(dlqPos, atoi64(c.Headers["outboxd-position"]))
	}
	checkPositions(t, "ledger.out", outPos, lf.valid)
	checkPositions(t, "ledger.dead", dlqPos, lf.malformed)
	checkBalances(t, out, lf)
	last, err := s.LastOutboxID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(out) + len(dlq)); n != last {
		t.Fatalf("%d messages, want one per outbox row: %d", n, last)
	}
	t.Logf("%d outputs and %d dead letters in the stream, once each, after 10 kills", len(out), len(dlq))
}

// readStream reads a stream's messages, checks each subject's are in
// outbox id order with no id twice, and returns them as consumed records
// (the position header is the item's position): ledger.out's, then
// ledger.dead's.
func readStream(t *testing.T, url, stream string) (out, dlq []consumed) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lastID := map[string]int64{}
	seen := map[int64]bool{}
	for n := uint64(0); n < info.State.Msgs; n++ {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("message %d of %d: %v", n+1, info.State.Msgs, err)
		}
		h := m.Headers()
		id, err := strconv.ParseInt(h.Get("Outboxd-Id"), 10, 64)
		if err != nil || h.Get("Outboxd-Sink") != "js" || h.Get("Outboxd-Feed") != "ledger" {
			t.Fatalf("message %s %q: headers %v", m.Subject(), m.Data(), h)
		}
		if seen[id] {
			t.Fatalf("outbox id %d twice in the stream", id)
		}
		seen[id] = true
		if id <= lastID[m.Subject()] {
			t.Fatalf("%s: outbox id %d after %d: out of order", m.Subject(), id, lastID[m.Subject()])
		}
		lastID[m.Subject()] = id
		pos := h.Get("Outboxd-Position") // PARTITION:EPOCH:POSITION
		c := consumed{Key: h.Get("Outboxd-Key"), Value: string(m.Data()),
			Headers: map[string]string{"outboxd-position": pos[strings.LastIndexByte(pos, ':')+1:]}}
		switch m.Subject() {
		case "ledger.out":
			out = append(out, c)
		case "ledger.dead":
			dlq = append(dlq, c)
		default:
			t.Fatalf("message on subject %s", m.Subject())
		}
	}
	return out, dlq
}
