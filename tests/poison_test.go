package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/outbox"
)

// joinLedgers joins ledger files with a line between each two (and none
// after the last): lines are the lines to put, without their "\n", each
// malformed for the ledger. It returns the whole file and the positions
// after the lines put.
func joinLedgers(parts []ledgerFile, lines []string) (ledgerFile, []int64) {
	all := ledgerFile{balances: map[string]int64{}}
	var ends []int64
	for i, p := range parts {
		off := int64(len(all.data))
		all.data = append(all.data, p.data...)
		for _, pos := range p.valid {
			all.valid = append(all.valid, off+pos)
		}
		for _, pos := range p.malformed {
			all.malformed = append(all.malformed, off+pos)
		}
		for acct, b := range p.balances {
			all.balances[acct] += b
		}
		all.amounts = append(all.amounts, p.amounts...)
		if i < len(lines) {
			all.data = append(append(all.data, lines[i]...), '\n')
			ends = append(ends, int64(len(all.data)))
			all.malformed = append(all.malformed, int64(len(all.data)))
		}
	}
	slices.Sort(all.malformed)
	return all, ends
}

// httpAddr is the API address a server logged.
func httpAddr(t *testing.T, p *proc) string {
	t.Helper()
	var addr string
	wait(t, 30*time.Second, func() error {
		m := regexp.MustCompile(`HTTP API listening.* addr=(\S+)`).FindStringSubmatch(p.log.String())
		if m == nil {
			return fmt.Errorf("the server's log names no HTTP address yet")
		}
		addr = m[1]
		return nil
	})
	return addr
}

// getJSON decodes the JSON answer of GET url into v.
func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// TestPoison_BigLines feeds lines of 1 MiB and 5 MiB among 20,000 ledger
// lines to two feeds of one file, a ledger (for which they are malformed)
// and a forward (whose outputs they are), killing the server with SIGKILL
// at random moments. Nothing blocks the relay: every other line's output
// is published exactly once; the big lines are dead letters kept whole in
// SQLite, the ledger's published cut (with outboxd-truncated) on
// ledger.dlq, the forward's outputs kept by the relay as output-too-large;
// the status and metrics count them exactly.
func TestPoison_BigLines(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 13))
	broker := startBroker(t)
	big := []string{strings.Repeat("x", 1<<20), strings.Repeat("y", 5<<20)}
	lf, bigEnds := joinLedgers([]ledgerFile{makeLedger(rng, 7000), makeLedger(rng, 7000), makeLedger(rng, 6000)}, big)
	dir := t.TempDir()
	input, db := filepath.Join(dir, "in.csv"), filepath.Join(dir, "outboxd.db")
	args := []string{"--db", db, "--brokers", broker, "--http", "127.0.0.1:0", "--max-line", strconv.Itoa(8 << 20),
		"--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--feed", "fwd=file:" + input, "--processor", "fwd=forward"}

	writing := appendSlowly(t, input, lf.data, 6*time.Second, rng)
	for range 8 {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(50+rng.IntN(600)) * time.Millisecond) // a random moment to crash at
		p.kill()
	}
	<-writing
	p := start(t, nil, args...)
	end := int64(len(lf.data))
	s := readStore(t, db)
	ctx := context.Background()
	wait(t, 120*time.Second, func() error {
		for _, feed := range []string{"ledger", "fwd"} {
			cps, err := s.ReadPositions(ctx, feed)
			if err != nil || len(cps) != 1 || cps[0].Position != end {
				return fmt.Errorf("%s: positions %+v (%v), want %d", feed, cps, err, end)
			}
		}
		return relayDone(ctx, s)
	})
	lines := int64(len(lf.valid) + len(lf.malformed))
	checkBigStatus(t, httpAddr(t, p), map[string][2]int64{
		"ledger": {int64(len(lf.valid)), int64(len(lf.malformed))},
		"fwd":    {lines, 2},
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}

	// One read: readAll reads up to the end markers it appends.
	got := readAll(t, broker, "ledger.out", "ledger.dlq", "fwd.out")
	checkLedgerOnce(t, got, lf)
	checkCutCopies(t, got["ledger.dlq"], big, bigEnds)
	checkForwarded(t, got["fwd.out"], lf, bigEnds)
	checkBigDeadLetters(t, s, big, bigEnds)
}

// checkLedgerOnce checks ledger.out and ledger.dlq as checkTopics does,
// allowing no repeat: every valid line's output once, in balance order,
// every malformed line once.
func checkLedgerOnce(t *testing.T, got map[string][]consumed, lf ledgerFile) {
	t.Helper()
	repeats := 0
	out := dedupe(t, got["ledger.out"], &repeats)
	dlq := dedupe(t, got["ledger.dlq"], &repeats)
	if repeats != 0 {
		t.Fatalf("%d repeated records, want none", repeats)
	}
	var outPos, dlqPos []int64
	for _, c := range out {
		outPos = append(outPos, atoi64(c.Headers[outbox.HeaderPosition]))
	}
	for _, c := range dlq {
		if c.Headers[ingest.HeaderReason] != ingest.ReasonMalformed {
			t.Fatalf("dead letter at %s: reason %q", c.Headers[outbox.HeaderPosition], c.Headers[ingest.HeaderReason])
		}
		dlqPos = append(dlqPos, atoi64(c.Headers[outbox.HeaderPosition]))
	}
	checkPositions(t, "ledger.out", outPos, lf.valid)
	checkPositions(t, "ledger.dlq", dlqPos, lf.malformed)
	checkBalances(t, out, lf)
}

// checkBigStatus checks each feed's applied and dead-lettered counts in
// its status, and the dead-lettered count in the metrics.
func checkBigStatus(t *testing.T, addr string, want map[string][2]int64) {
	t.Helper()
	for feed, w := range want {
		var st api.FeedStatus
		if err := getJSON("http://"+addr+"/feeds/"+feed+"/status", &st); err != nil {
			t.Fatal(err)
		}
		if st.Applied != w[0] || st.DeadLettered != w[1] || !st.Lossless || st.CompletionFailures != 0 || st.ReplaysSkipped != 0 {
			t.Errorf("%s status: applied %d, dead-lettered %d, lossless %v, %d completion failures, %d replays; want %d, %d, true, 0, 0",
				feed, st.Applied, st.DeadLettered, st.Lossless, st.CompletionFailures, st.ReplaysSkipped, w[0], w[1])
		}
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		t.Fatal(err)
	}
	for feed, w := range want {
		// The dead letters by reason, summed over the reasons.
		prefix := fmt.Sprintf("outboxd_feed_dead_letters_total{feed=%q,reason=", feed)
		var n int64
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, prefix) {
				n += atoi64(l[strings.LastIndexByte(l, ' ')+1:])
			}
		}
		if n != w[1] {
			t.Errorf("metrics count %d dead letters of %s, want %d", n, feed, w[1])
		}
	}
}

// checkCutCopies checks the big lines' records on ledger.dlq: one each, its
// value the line's start, cut to fit 1 MiB, saying so; and that no record
// of the topic carries an outboxd-* header twice.
func checkCutCopies(t *testing.T, dlq []consumed, big []string, ends []int64) {
	t.Helper()
	found := 0
	for _, c := range dlq {
		if len(c.Twice) > 0 {
			t.Errorf("dead letter at %s carries %v twice", c.Headers[outbox.HeaderPosition], c.Twice)
		}
		i := slices.Index(ends, atoi64(c.Headers[outbox.HeaderPosition]))
		if i < 0 {
			continue
		}
		found++
		if !strings.HasPrefix(big[i], c.Value) || len(c.Value) < 1<<20-4096 || len(c.Value) >= len(big[i]) {
			t.Errorf("copy of the %d-byte line: %d bytes, want its start, cut to under 1 MiB", len(big[i]), len(c.Value))
		}
		if want := "value=" + strconv.Itoa(len(big[i])); c.Headers[ingest.HeaderTruncated] != want {
			t.Errorf("copy of the %d-byte line: %s = %q, want %q", len(big[i]), ingest.HeaderTruncated, c.Headers[ingest.HeaderTruncated], want)
		}
	}
	if found != len(big) {
		t.Errorf("%d big lines on ledger.dlq, want %d", found, len(big))
	}
}

// checkForwarded checks fwd.out holds every line's output exactly once but
// the big lines', which Kafka does not take.
func checkForwarded(t *testing.T, out []consumed, lf ledgerFile, bigEnds []int64) {
	t.Helper()
	var want []int64
	for _, pos := range append(slices.Clone(lf.valid), lf.malformed...) {
		if !slices.Contains(bigEnds, pos) {
			want = append(want, pos)
		}
	}
	slices.Sort(want)
	seen := map[string]bool{}
	var got []int64
	for _, c := range out {
		if seen[c.Headers[outbox.HeaderID]] {
			t.Fatalf("fwd.out: outbox row %s twice", c.Headers[outbox.HeaderID])
		}
		seen[c.Headers[outbox.HeaderID]] = true
		if len(c.Twice) > 0 || c.Headers[outbox.HeaderFeed] != "fwd" {
			t.Fatalf("fwd.out record %s: headers %v, twice %v", c.Headers[outbox.HeaderID], c.Headers, c.Twice)
		}
		got = append(got, atoi64(c.Headers[outbox.HeaderPosition]))
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("fwd.out holds %d outputs, want the %d lines but the big ones", len(got), len(want))
	}
}

// checkBigDeadLetters checks SQLite holds the big lines whole: the
// ledger's as malformed items, the forward's as outputs Kafka did not take.
func checkBigDeadLetters(t *testing.T, s *outbox.Store, big []string, ends []int64) {
	t.Helper()
	ctx := context.Background()
	for feed, reason := range map[string]string{"ledger": ingest.ReasonMalformed, "fwd": ingest.ReasonOutputTooLarge} {
		ds, err := s.DeadLetters(ctx, feed, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, d := range ds {
			i := slices.Index(ends, d.Position)
			if i < 0 {
				if feed == "fwd" {
					t.Errorf("fwd: dead letter at %d, want only the big lines", d.Position)
				}
				continue
			}
			found++
			if d.Reason != reason || string(d.Payload) != big[i] || (feed == "fwd") != (d.OutboxID != nil && d.Topic == "fwd.out") {
				t.Errorf("%s: dead letter at %d: %s, %d payload bytes, outbox row %v, topic %q; want %s, the %d-byte line whole",
					feed, d.Position, d.Reason, len(d.Payload), d.OutboxID, d.Topic, reason, len(big[i]))
			}
		}
		if found != len(big) {
			t.Errorf("%s: %d big lines dead-lettered, want %d", feed, found, len(big))
		}
	}
}

// TestHeaders_ReEmitted: records re-emitted through the outbox carry each
// outboxd-* header once, with the right values. An order paid and never
// placed goes to orders.retry 4 times and is then a dead letter after 5
// attempts; a malformed record that came from another outboxd keeps that
// one's place headers as outboxd-orig-*.
func TestHeaders_ReEmitted(t *testing.T) {
	broker := startBroker(t)
	createTopic(t, broker, "orders.events", 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic("orders.events"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	upstream := []kgo.RecordHeader{{Key: "trace", Value: []byte("t-1")}, {Key: outbox.HeaderID, Value: []byte("999")},
		{Key: outbox.HeaderFeed, Value: []byte("upstream")}, {Key: outbox.HeaderEpoch, Value: []byte("U:0")},
		{Key: outbox.HeaderPosition, Value: []byte("5")}}
	err = cl.ProduceSync(context.Background(),
		&kgo.Record{Key: []byte("o-9"), Value: []byte(`{"type":"paid","at":"2026-01-01T00:00:00Z"}`)},
		&kgo.Record{Key: []byte("o-8"), Value: []byte("not json"), Headers: upstream},
	).FirstErr()
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(t.TempDir(), "outboxd.db")
	p := start(t, nil, "--db", db, "--feed", "orders=kafka:orders.events", "--processor", "orders=orders",
		"--brokers", broker, "--http", "127.0.0.1:0", "--retry-delay", "20ms")
	s := readStore(t, db)
	ctx := context.Background()
	wait(t, 60*time.Second, func() error {
		f, err := s.Feed(ctx, "orders")
		if err != nil || f.DeadLettered != 2 {
			return fmt.Errorf("feed %+v (%v), want 2 dead letters", f, err)
		}
		return relayDone(ctx, s)
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	cps, err := s.ReadPositions(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	epochs := map[int32]string{}
	for _, c := range cps {
		epochs[c.Partition] = c.Epoch
	}
	got := readAll(t, broker, "orders.retry", "orders.dlq")
	if n := len(got["orders.retry"]); n != 4 {
		t.Fatalf("%d retry records, want 4", n)
	}
	// The order's retries are keyed by it: one partition of orders.retry.
	main, retry := epochs[0], epochs[kafkafeed.FeedPartition(1, got["orders.retry"][0].Partition)]
	if main == "" || retry == "" {
		t.Fatalf("positions %+v: want the events' and the retry topic's", cps)
	}

	origin := map[string]string{ingest.HeaderOrigTopic: "orders.events", ingest.HeaderOrigPartition: "0",
		ingest.HeaderOrigOffset: "0", ingest.HeaderOrigEpoch: main}
	var last consumed
	for i, c := range got["orders.retry"] {
		want := maps(origin, map[string]string{ingest.HeaderRetryAttempt: strconv.Itoa(i + 2), outbox.HeaderFeed: "orders",
			outbox.HeaderEpoch: retry, outbox.HeaderPosition: strconv.FormatInt(got["orders.retry"][max(i-1, 0)].Offset+1, 10)})
		if i == 0 { // the first round comes from the events topic
			want[outbox.HeaderEpoch], want[outbox.HeaderPosition] = main, "1"
		}
		checkOutboxdHeaders(t, fmt.Sprintf("retry %d", i+2), c, want, outbox.HeaderID, ingest.HeaderRetryDue)
		last = c
	}
	dead := map[string]consumed{}
	for _, c := range got["orders.dlq"] {
		dead[c.Headers[ingest.HeaderReason]] = c
	}
	ds, err := s.DeadLetters(ctx, "orders", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, d := range ds {
		ids[d.Reason] = strconv.FormatInt(d.ID, 10)
		if want := map[string]int{"invalid-transition": 5, "malformed": 1}[d.Reason]; d.Attempts != want {
			t.Errorf("%s dead letter: %d attempts in the store, want %d", d.Reason, d.Attempts, want)
		}
	}
	checkOutboxdHeaders(t, "invalid-transition dead letter", dead["invalid-transition"], maps(origin, map[string]string{
		ingest.HeaderReason: "invalid-transition", ingest.HeaderAttempts: "5", ingest.HeaderDeadID: ids["invalid-transition"],
		ingest.HeaderRetryAttempt: "5", ingest.HeaderRetryDue: last.Headers[ingest.HeaderRetryDue],
		"outboxd-orig-id": last.Headers[outbox.HeaderID], "outboxd-orig-feed": "orders",
		"outboxd-orig-position": last.Headers[outbox.HeaderPosition],
		outbox.HeaderFeed:       "orders", outbox.HeaderEpoch: retry, outbox.HeaderPosition: strconv.FormatInt(last.Offset+1, 10),
	}), outbox.HeaderID, ingest.HeaderError)
	checkOutboxdHeaders(t, "malformed dead letter", dead["malformed"], map[string]string{
		ingest.HeaderReason: "malformed", ingest.HeaderAttempts: "1", ingest.HeaderDeadID: ids["malformed"],
		"outboxd-orig-id": "999", "outboxd-orig-feed": "upstream", "outboxd-orig-epoch": "U:0", "outboxd-orig-position": "5",
		outbox.HeaderFeed: "orders", outbox.HeaderEpoch: main, outbox.HeaderPosition: "2",
	}, outbox.HeaderID, ingest.HeaderError)
	if dead["malformed"].Headers["trace"] != "t-1" {
		t.Errorf("malformed dead letter: trace header %q, want the item's t-1", dead["malformed"].Headers["trace"])
	}
}

// maps returns the union of ms, later ones winning.
func maps(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// checkOutboxdHeaders checks that c carries each outboxd-* header once: the
// ones in want with those values, the ones in any with some value, and no
// other.
func checkOutboxdHeaders(t *testing.T, what string, c consumed, want map[string]string, any ...string) {
	t.Helper()
	if len(c.Twice) > 0 {
		t.Errorf("%s: %v twice", what, c.Twice)
	}
	for k, v := range c.Headers {
		if !strings.HasPrefix(k, outbox.HeaderPrefix) {
			continue
		}
		w, ok := want[k]
		switch {
		case slices.Contains(any, k):
			if v == "" {
				t.Errorf("%s: %s is empty", what, k)
			}
		case !ok:
			t.Errorf("%s: unexpected header %s=%q", what, k, v)
		case v != w:
			t.Errorf("%s: %s = %q, want %q", what, k, v, w)
		}
	}
	for k := range want {
		if _, ok := c.Headers[k]; !ok {
			t.Errorf("%s: no %s header", what, k)
		}
	}
	for _, k := range any {
		if _, ok := c.Headers[k]; !ok {
			t.Errorf("%s: no %s header", what, k)
		}
	}
}
