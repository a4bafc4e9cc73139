package ingest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// TestRetryTopic: an item sent to the retry topic comes back with its
// origin and attempt, each outboxd-* header once; an item of another topic
// is its own origin; a retry record without its headers is malformed.
func TestRetryTopic(t *testing.T) {
	first := ingest.Delivery{Feed: "o", Partition: 2, Topic: "events", Epoch: "id:2", Position: 41}
	item := ingest.Item{Key: []byte("k"), Value: []byte("v"), Headers: []outbox.Header{
		{Key: "trace", Value: []byte("t1")}, {Key: "outboxd-id", Value: []byte("9")},
	}}
	from, attempt, err := ingest.OriginOf(first, item, "o.retry")
	want := ingest.Origin{Topic: "events", Partition: 2, Epoch: "id:2", Offset: 40}
	if err != nil || from != want || attempt != 1 {
		t.Fatalf("first read: %+v attempt %d, %v; want %+v attempt 1", from, attempt, err, want)
	}
	due := time.UnixMilli(1_700_000_000_123)
	out := ingest.RetryOutput("o.retry", item, from, 2, due)
	seen := map[string]int{}
	for _, h := range out.Headers {
		seen[h.Key]++
	}
	if out.Topic != "o.retry" || string(out.Key) != "k" || string(out.Value) != "v" || seen["outboxd-id"] != 0 || seen["trace"] != 1 {
		t.Fatalf("retry output %+v", out)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("header %s %d times", k, n)
		}
	}
	back := ingest.Delivery{Feed: "o", Partition: 1<<16 + 0, Topic: "o.retry", Epoch: "rid:0", Position: 8}
	got, attempt, err := ingest.OriginOf(back, ingest.Item{Key: out.Key, Value: out.Value, Headers: out.Headers}, "o.retry")
	if err != nil || got != want || attempt != 2 {
		t.Fatalf("back from the retry topic: %+v attempt %d, %v; want %+v attempt 2", got, attempt, err, want)
	}
	if d, ok := ingest.RetryDue(out.Headers); !ok || !d.Equal(due) {
		t.Fatalf("due %v %v, want %v", d, ok, due)
	}
	_, _, err = ingest.OriginOf(back, ingest.Item{Key: out.Key, Value: out.Value}, "o.retry")
	var p *ingest.PermanentError
	if !errors.As(err, &p) || p.Reason != ingest.ReasonMalformed {
		t.Fatalf("a retry record without headers: %v, want a malformed dead letter", err)
	}
}
