package orders

import (
	"strings"
	"testing"
	"time"
)

func TestDecode(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 500, time.FixedZone("CET", 3600))
	t.Run("OK", func(t *testing.T) {
		for _, typ := range []string{"placed", "paid", "shipped", "delivered", "cancelled"} {
			e, reason, err := Decode([]byte("o-1"), []byte(`{"type":"`+typ+`","at":"2026-03-01T12:00:00.0000005+01:00","extra":[1,2]}`))
			if err != nil || reason != "" {
				t.Fatalf("%s: %q, %v", typ, reason, err)
			}
			if e.OrderID != "o-1" || e.Type != typ || !e.At.Equal(at) || e.At.Location() != time.UTC {
				t.Errorf("%s: decoded %+v", typ, e)
			}
		}
	})
	cases := []struct {
		name       string
		key, value string
		reason     string
		err        string
	}{
		{"NoKey", "", `{"type":"placed","at":"2026-03-01T12:00:00Z"}`, ReasonMalformed, "no key"},
		{"NotJSON", "o", `placed at noon`, ReasonMalformed, "not an event"},
		{"Empty", "o", ``, ReasonMalformed, "not an event"},
		{"Array", "o", `[1]`, ReasonMalformed, "not an event"},
		{"TypeNotString", "o", `{"type":5,"at":"2026-03-01T12:00:00Z"}`, ReasonMalformed, "not an event"},
		{"BadAt", "o", `{"type":"paid","at":"yesterday"}`, ReasonMalformed, "not an event"},
		{"Null", "o", `null`, ReasonMalformed, "no type"},
		{"NoType", "o", `{"at":"2026-03-01T12:00:00Z"}`, ReasonMalformed, "no type"},
		{"EmptyType", "o", `{"type":"","at":"2026-03-01T12:00:00Z"}`, ReasonMalformed, "no type"},
		{"NoAt", "o", `{"type":"paid"}`, ReasonMalformed, "no at"},
		{"ZeroAt", "o", `{"type":"paid","at":"0001-01-01T00:00:00Z"}`, ReasonMalformed, "no at"},
		{"UnknownType", "o", `{"type":"refunded","at":"2026-03-01T12:00:00Z"}`, ReasonUnknownType, `"refunded"`},
		{"TypeCase", "o", `{"type":"Paid","at":"2026-03-01T12:00:00Z"}`, ReasonUnknownType, `"Paid"`},
		{"MalformedBeforeUnknown", "o", `{"type":"refunded"}`, ReasonMalformed, "no at"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, reason, err := Decode([]byte(c.key), []byte(c.value))
			if reason != c.reason || err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("Decode(%q, %q) = %q, %v; want %q, an error with %q", c.key, c.value, reason, err, c.reason, c.err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("o-1"), []byte(`{"type":"placed","at":"2026-03-01T12:00:00Z"}`))
	f.Add([]byte(""), []byte(`{"type":"paid","at":"2026-03-01T12:00:00Z"}`))
	f.Add([]byte("o"), []byte(`{"type":"x","at":"2026-03-01T12:00:00.123+05:30"}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		e, reason, err := Decode(key, value)
		if err == nil {
			if reason != "" || len(key) == 0 || !KnownType(e.Type) || e.At.IsZero() || e.OrderID != string(key) {
				t.Fatalf("Decode(%q, %q) accepted %+v, reason %q", key, value, e, reason)
			}
			return
		}
		if reason != ReasonMalformed && reason != ReasonUnknownType {
			t.Fatalf("Decode(%q, %q): reason %q for %v", key, value, reason, err)
		}
	})
}
