package ingest

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outboxd/outboxd/outbox"
)

// TestDeadLetterOutput: a dead letter's Kafka copy is the item whole while
// it fits the record limit, and otherwise cut to fit, saying what was cut.
func TestDeadLetterOutput(t *testing.T) {
	const limit = 16 << 10
	budget := limit - outbox.RecordBatchOverhead
	p := outbox.Place{Feed: "ledger", Epoch: "65024:9979361:7d453c7ecb0cbfce", Position: 1 << 40}
	own := deadLetterHeaders{reason: ReasonMalformed, err: "no comma: want account,amount", attempts: 3, id: 12}
	big := func(c string, n int) []byte { return bytes.Repeat([]byte(c), n/len(c)) }
	cases := []struct {
		name      string
		item      Item
		err       string
		truncated string // "" when whole
		check     func(t *testing.T, got outbox.Output)
	}{
		{name: "Whole", item: Item{Key: []byte("k"), Value: big("v", 1000), Headers: []outbox.Header{{Key: "h", Value: []byte("1")}}}},
		{name: "Value", item: Item{Value: big("v", 5*limit)}, truncated: "value=81920", check: func(t *testing.T, got outbox.Output) {
			if n := outbox.PublishedBytes(p, got); n != budget || !bytes.Equal(got.Value, big("v", 5*limit)[:len(got.Value)]) {
				t.Errorf("cut to %d bytes, a record of %d: want the value's start, a record of exactly %d", len(got.Value), n, budget)
			}
		}},
		{name: "ValueText", item: Item{Value: big("é", 5*limit)}, truncated: "value=81920", check: func(t *testing.T, got outbox.Output) {
			if n := outbox.PublishedBytes(p, got); n > budget || n < budget-1 || !utf8.Valid(got.Value) {
				t.Errorf("a record of %d, valid UTF-8 %v: want whole characters within %d", n, utf8.Valid(got.Value), budget)
			}
		}},
		{name: "Error", item: Item{Value: []byte("x")}, err: strings.Repeat("e", 2*limit), truncated: "error=32768",
			check: func(t *testing.T, got outbox.Output) {
				if v, _ := HeaderValue(got.Headers, HeaderError); len(v) != maxCutError || string(got.Value) != "x" {
					t.Errorf("error of %d bytes, value %q: want %d bytes and the value whole", len(v), got.Value, maxCutError)
				}
			}},
		{name: "Headers", item: Item{Value: []byte("x"), Headers: []outbox.Header{{Key: "a", Value: big("h", 2*limit)}, {Key: "b", Value: []byte("c")}}},
			truncated: "headers=32771", check: func(t *testing.T, got outbox.Output) {
				if _, ok := HeaderValue(got.Headers, "a"); ok || string(got.Value) != "x" {
					t.Errorf("headers %d, value %q: want the item's dropped, the value whole", len(got.Headers), got.Value)
				}
			}},
		{name: "KeyAndNullValue", item: Item{Key: big("k", 3*limit)}, truncated: "key=49152", check: func(t *testing.T, got outbox.Output) {
			if n := outbox.PublishedBytes(p, got); n != budget || got.Value != nil || !bytes.Equal(got.Key, big("k", 3*limit)[:len(got.Key)]) {
				t.Errorf("key cut to %d, value nil %v, a record of %d: want the key's start, a null value, %d", len(got.Key), got.Value == nil, n, budget)
			}
		}},
		{name: "KeyAndValue", item: Item{Key: big("k", 3*limit), Value: big("v", 100)}, truncated: "value=100,key=49152",
			check: func(t *testing.T, got outbox.Output) {
				if got.Value == nil || len(got.Value) != 0 {
					t.Errorf("value %d bytes (nil %v), want empty, not null", len(got.Value), got.Value == nil)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := own
			if c.err != "" {
				h.err = c.err
			}
			got := h.output(p, "ledger.dlq", c.item, limit)
			if got.Topic != "ledger.dlq" {
				t.Errorf("topic %s", got.Topic)
			}
			if n := outbox.PublishedBytes(p, got); n > budget {
				t.Fatalf("a record of %d bytes, over %d", n, budget)
			}
			v, cut := HeaderValue(got.Headers, HeaderTruncated)
			if string(v) != c.truncated || cut != (c.truncated != "") {
				t.Errorf("%s = %q (%v), want %q", HeaderTruncated, v, cut, c.truncated)
			}
			if c.truncated == "" && (!bytes.Equal(got.Value, c.item.Value) || !bytes.Equal(got.Key, c.item.Key) ||
				len(got.Headers) != len(c.item.Headers)+4) {
				t.Errorf("whole copy changed: %d key, %d value bytes, %d headers", len(got.Key), len(got.Value), len(got.Headers))
			}
			for _, k := range []string{HeaderReason, HeaderAttempts, HeaderDeadID} {
				if _, ok := HeaderValue(got.Headers, k); !ok {
					t.Errorf("no %s header", k)
				}
			}
			if c.check != nil {
				c.check(t, got)
			}
		})
	}
}
