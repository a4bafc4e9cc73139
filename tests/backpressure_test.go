package tests

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
)

// With Kafka cut off, ingest stops at the backlog's bound instead of
// filling the disk: the feed's state says backpressure (in its status and
// the metrics), its position stops, the backlog stays within a batch of
// the bound, also across a kill -9 and a restart while Kafka is still
// away. Kafka back, the relay drains the backlog, ingest resumes by
// itself, and every line's output is published exactly once.
func TestBackpressure_KafkaAway(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	lf := ledgerWithDeadLetters(rng, 30_000)
	ends := slices.Sorted(slices.Values(append(slices.Clone(lf.valid), lf.malformed...)))
	px := startProxiedBroker(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	db := filepath.Join(dir, "outboxd.db")
	first := ends[999] // after the first 1000 lines
	if err := os.WriteFile(input, lf.data[:first], 0o644); err != nil {
		t.Fatal(err)
	}
	const bound, batch = 5000, 500
	args := ledgerArgs(db, input, "--http", "127.0.0.1:0", "--brokers", px.Addr(),
		"--max-backlog-rows", fmt.Sprint(bound), "--max-backlog-bytes", "1GiB", "--batch-max", fmt.Sprint(batch))
	p := start(t, nil, args...)
	base := apiBase(t, p)
	wait(t, 60*time.Second, func() error { return published(db, first) })

	px.setDown(true)
	mid := ends[20_000] // the rest comes while ingest is held
	appendFile(t, input, string(lf.data[first:mid]))
	held := func(base string) (feedState, outboxState) {
		t.Helper()
		fs := waitFeed(t, base, "ledger", "backpressure", fmt.Sprintf("past its bound (at most 1.0 GiB, at most %d rows)", bound))
		var ost outboxState
		if err := getJSON(base+"/outbox/status", &ost); err != nil {
			t.Fatal(err)
		}
		if ost.Pending <= bound || ost.Pending > bound+batch || ost.MaxBacklogRows != bound || ost.MaxBacklogBytes != 1<<30 {
			t.Fatalf("held with %d rows pending (bound %d rows, %d bytes), want past %d by a batch (%d) at most",
				ost.Pending, ost.MaxBacklogRows, ost.MaxBacklogBytes, bound, batch)
		}
		// Ledger outputs, about 110 bytes each, take about 40 on disk,
		// packed and compressed in chunks.
		if ost.PendingBytes < 16*ost.Pending {
			t.Fatalf("%d bytes pending for %d rows: under 16 a row", ost.PendingBytes, ost.Pending)
		}
		return fs, ost
	}
	// A transaction already under way when Kafka went away may still
	// commit, and the loop then takes a batch more: hold still counts from
	// once the relay has failed to publish.
	wait(t, 60*time.Second, func() error {
		var ost outboxState
		if err := getJSON(base+"/outbox/status", &ost); err != nil {
			return err
		}
		if ost.Relay.State != "backing-off" {
			return fmt.Errorf("relay %s, want backing-off", ost.Relay.State)
		}
		return nil
	})
	fs, os1 := held(base)
	if fs.Position <= first || fs.Position >= int64(len(lf.data)) {
		t.Fatalf("held at position %d, want between %d and %d", fs.Position, first, len(lf.data))
	}
	metric := `outboxd_feed_state{feed="ledger",state="backpressure"} 1`
	if m := get(t, base+"/metrics"); !strings.Contains(m, metric) {
		t.Fatalf("/metrics lacks %s", metric)
	}
	// Held: nothing moves while Kafka is away (three of the loop's looks
	// at the backlog, and a metadata round of the relay's retries).
	time.Sleep(3 * time.Second)
	if fs2, os2 := held(base); fs2.Position != fs.Position || os2.Pending != os1.Pending {
		t.Fatalf("moved while held: position %d -> %d, pending %d -> %d", fs.Position, fs2.Position, os1.Pending, os2.Pending)
	}

	// Lines written while held show in the feed's end and lag, though
	// none is read.
	appendFile(t, input, string(lf.data[mid:]))
	waitStatus(t, base, 30*time.Second, func(st api.FeedStatus) error {
		if st.State != "backpressure" || st.Position != fs.Position || st.End != int64(len(lf.data)) || st.Lag != st.End-st.Position {
			return fmt.Errorf("%s at %d, end %d, lag %d; want backpressure at %d, end %d, lag %d",
				st.State, st.Position, st.End, st.Lag, fs.Position, len(lf.data), int64(len(lf.data))-fs.Position)
		}
		return nil
	})

	// A crash while held, and a restart with Kafka still away: the new
	// server counts the backlog it finds and holds at once.
	p.kill()
	p = start(t, nil, args...)
	base = apiBase(t, p)
	if fs3, _ := held(base); fs3.Position != fs.Position {
		t.Fatalf("restarted: position %d, want %d (held)", fs3.Position, fs.Position)
	}

	px.setDown(false)
	waitPublished(t, db, int64(len(lf.data)))
	waitFeed(t, base, "ledger", "caught-up")
	if n := logged(p, "the outbox backlog is below its bound: ingest resumes"); n < 1 {
		t.Fatal("the server did not say ingest resumed")
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	checkTopics(t, px.Addr(), lf, 0)
}

// get returns the body of GET url.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
