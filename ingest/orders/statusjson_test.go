package orders

import (
	"encoding/json"
	"testing"
	"time"
)

// appendStatusChange writes what json.Marshal writes, byte for byte, on
// the fast path and on the slow one, and fails where it fails.
func TestAppendStatusChange(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	cases := []StatusChange{
		{OrderID: "o-1-0", Status: Placed, At: at},
		{OrderID: "o-1-0", Status: Paid, Previous: Placed, At: at.Add(time.Nanosecond)},
		{OrderID: "o-1-0", Status: Delivered, Previous: Shipped, At: at.Truncate(time.Second)},
		{OrderID: "", Status: Cancelled, Previous: Paid, At: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		{OrderID: "ordre-é-日本", Status: Placed, At: at},
		{OrderID: `quote"back\slash`, Status: Placed, At: at},
		{OrderID: "<html>&amp;", Status: Placed, At: at},
		{OrderID: "tab\tnewline\n\x00\x1f", Status: Placed, At: at},
		{OrderID: "line\u2028para\u2029", Status: Placed, At: at},
		{OrderID: "bad\xffutf8\xc3", Status: Placed, At: at},
		{OrderID: "replacement\ufffd", Status: Placed, At: at},
		{OrderID: "o", Status: Placed, At: time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)},
	}
	for _, c := range cases {
		want, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("json.Marshal(%+v): %v", c, err)
		}
		got, err := appendStatusChange([]byte("prefix"), c)
		if err != nil {
			t.Fatalf("appendStatusChange(%+v): %v", c, err)
		}
		if string(got) != "prefix"+string(want) {
			t.Errorf("appendStatusChange(%+v)\n got %s\nwant prefix%s", c, got, want)
		}
	}
	for _, y := range []int{-1, 10000} {
		c := StatusChange{OrderID: "o", Status: Placed, At: time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC)}
		if _, err := appendStatusChange(nil, c); err == nil {
			t.Errorf("year %d: no error, want json.Marshal's", y)
		}
	}
}

// BenchmarkAppendStatusChange is a status change's encoding, against
// json.Marshal's.
func BenchmarkAppendStatusChange(b *testing.B) {
	c := StatusChange{OrderID: "o-123-4", Status: Paid, Previous: Placed, At: time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf, _ = appendStatusChange(buf[:0], c)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(c)
		}
	})
}

// decodePlain decodes what json.Unmarshal decodes the same way, and
// leaves to it every value it does not.
func TestDecodePlain(t *testing.T) {
	for _, v := range []string{
		`{"type":"placed","at":"2026-01-01T00:00:00.001Z"}`,
		`{"type":"paid","at":"2026-01-01T00:00:00Z"}`,
		`{"type":"shipped","at":"2026-01-01T02:00:00.123456789+02:00"}`,
		`{"type":"","at":"2026-01-01T00:00:00Z"}`,
		`{"type":"x y","at":"2026-01-01T00:00:00Z"}`,
		`{"type":"placed","at":""}`,
		`{"type":"placed","at":"2026-13-01T00:00:00Z"}`,
		`{"type":"placed","at":"2026-01-01 00:00:00Z"}`,
		`{"type":"placed","at":null}`,
		`{"type":"placed","at":"2026-01-01T00:00:00Z"} `,
		`{"type":"placed","at":"2026-01-01T00:00:00Z","x":1}`,
		`{"type":"pl\u0061ced","at":"2026-01-01T00:00:00Z"}`,
		`{"type":"placé","at":"2026-01-01T00:00:00Z"}`,
		`{"type":"placed","at":"2026-01-01T00:00:00\u005a"}`,
		`{"type":"placed","at":"2026-01-01T00:00:00Z"`,
		`{"type":"placed","at":"2026-01-01T00:00:00Z"}}`,
		`{"type":"placed","at":"20"26-01-01T00:00:00Z"}`,
		`{"type":"placed","at":"`,
		`{"type":"`,
	} {
		var fast, slow wireEvent
		ok := fast.decodePlain([]byte(v))
		err := json.Unmarshal([]byte(v), &slow)
		if !ok {
			if fast != (wireEvent{}) {
				t.Errorf("%s: not decoded, yet w = %+v", v, fast)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: decoded as %+v, json.Unmarshal refuses it: %v", v, fast, err)
			continue
		}
		if fast.Type != slow.Type || !fast.At.Equal(slow.At) || fast.At.String() != slow.At.String() {
			t.Errorf("%s: %+v, json.Unmarshal %+v", v, fast, slow)
		}
	}
	var w wireEvent
	if !w.decodePlain([]byte(`{"type":"placed","at":"2026-01-01T00:00:00.001Z"}`)) {
		t.Fatal("the events server bench writes are not on the fast path")
	}
}
