package ingest_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestLoop_DeadLetterCut: an item too large for a Kafka record is a dead
// letter kept whole in the store; its copy for the dead-letter topic is cut
// to fit the record limit and says so. The other items go on as usual.
func TestLoop_DeadLetterCut(t *testing.T) {
	const limit = 64 << 10
	s := outboxtest.TempStore(t)
	huge := "bad" + strings.Repeat("z", 2<<20)
	f := newMemFeed("e1", "a", huge, "b")
	cfg := testConfig()
	cfg.MaxMessageBytes = limit
	_, stop := running(t, s, f, newCounter(), cfg)
	wait(t, 10*time.Second, positionIs(s, "f", "e1", 3))
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	ds, err := s.DeadLetters(context.Background(), "f", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || string(ds[0].Payload) != huge || ds[0].Reason != ingest.ReasonMalformed || ds[0].Position != 2 {
		t.Fatalf("%d dead letters, want the huge item whole, malformed, at 2", len(ds))
	}
	rows, err := s.Rows(context.Background(), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var dlq []outbox.Row
	var out []string
	for _, r := range rows {
		if r.Topic == "f.dlq" {
			dlq = append(dlq, r)
		} else {
			out = append(out, string(r.Value))
		}
	}
	if len(dlq) != 1 || strings.Join(out, ",") != "a,b" {
		t.Fatalf("%d dead-letter rows and outputs %q, want 1 and a,b", len(dlq), out)
	}
	r := dlq[0]
	hs, err := outbox.DecodeHeaders(r.Headers)
	if err != nil {
		t.Fatal(err)
	}
	size := outbox.PublishedBytes(outbox.Place{Feed: "f", Epoch: "e1", Position: 2},
		outbox.Output{Key: r.Key, Value: r.Value, Headers: hs})
	if size != limit-outbox.RecordBatchOverhead || !bytes.HasPrefix([]byte(huge), r.Value) || len(r.Value) == 0 {
		t.Errorf("the copy's value is %d bytes, a record of %d: want the item's start, a record of exactly %d",
			len(r.Value), size, limit-outbox.RecordBatchOverhead)
	}
	want := map[string]string{
		// The counter's error quotes the value: it is cut too.
		ingest.HeaderTruncated: "value=2097155,error=2097170", ingest.HeaderReason: ingest.ReasonMalformed,
		ingest.HeaderAttempts: "1", ingest.HeaderDeadID: "1",
	}
	for k, v := range want {
		if got, _ := ingest.HeaderValue(hs, k); string(got) != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if e, _ := ingest.HeaderValue(hs, ingest.HeaderError); len(e) != 1024 || !strings.HasPrefix(ds[0].Error, string(e)) {
		t.Errorf("error header of %d bytes, want the error's first 1024", len(e))
	}
	st := stats(t, s)
	if st.DeadLettered != 1 || st.Applied != 2 {
		t.Errorf("stats %+v, want 1 dead letter and 2 applied", st)
	}
}

// TestLoop_DeadLetterAttempts: a dead letter counts the attempts the
// processor says it made (rounds through a retry topic), in the store and
// in its copy's header.
func TestLoop_DeadLetterAttempts(t *testing.T) {
	s := outboxtest.TempStore(t)
	f := newMemFeed("e1", "a")
	proc := ingest.ProcessorFunc(func(context.Context, *outbox.Tx, ingest.Delivery, ingest.Item) error {
		return ingest.PermanentAfter("invalid-transition", 5, context.DeadlineExceeded)
	})
	_, stop := running(t, s, f, proc, testConfig())
	wait(t, 10*time.Second, positionIs(s, "f", "e1", 1))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ds, err := s.DeadLetters(context.Background(), "f", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := s.Rows(context.Background(), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || ds[0].Attempts != 5 || len(rows) != 1 {
		t.Fatalf("%d dead letters (%+v), %d rows: want one after 5 attempts", len(ds), ds, len(rows))
	}
	hs, err := outbox.DecodeHeaders(rows[0].Headers)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := ingest.HeaderValue(hs, ingest.HeaderAttempts); string(v) != "5" {
		t.Errorf("%s = %q, want 5", ingest.HeaderAttempts, v)
	}
}
