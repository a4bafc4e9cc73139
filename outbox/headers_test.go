package outbox_test

import (
	"bytes"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// sameHeaders compares headers by content: an empty value may come back as
// nil or as an empty slice, the encoding does not tell them apart.
func sameHeaders(a, b []outbox.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

func TestEncodeHeaders(t *testing.T) {
	t.Run("NoneIsNil", func(t *testing.T) {
		if b := outbox.EncodeHeaders(nil); b != nil {
			t.Fatalf("EncodeHeaders(nil) = %x, want nil", b)
		}
		if b := outbox.EncodeHeaders([]outbox.Header{}); b != nil {
			t.Fatalf("EncodeHeaders([]) = %x, want nil", b)
		}
	})

	t.Run("Layout", func(t *testing.T) {
		got := outbox.EncodeHeaders([]outbox.Header{{Key: "ab", Value: []byte{0xff}}, {Key: "", Value: nil}})
		want := []byte{2, 2, 'a', 'b', 1, 0xff, 0, 0}
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeHeaders = %x, want %x", got, want)
		}
	})

	t.Run("LongLengthIsMultiByteVarint", func(t *testing.T) {
		v := bytes.Repeat([]byte{'x'}, 300)
		got := outbox.EncodeHeaders([]outbox.Header{{Key: "k", Value: v}})
		want := append([]byte{1, 1, 'k', 0xac, 0x02}, v...)
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeHeaders = %x, want %x", got[:8], want[:8])
		}
	})
}

func TestDecodeHeaders(t *testing.T) {
	t.Run("NilAndEmpty", func(t *testing.T) {
		for _, b := range [][]byte{nil, {}} {
			hs, err := outbox.DecodeHeaders(b)
			if err != nil || hs != nil {
				t.Fatalf("DecodeHeaders(%x) = %+v, %v; want nil, nil", b, hs, err)
			}
		}
	})

	t.Run("RoundTrip", func(t *testing.T) {
		binary := make([]byte, 256)
		for i := range binary {
			binary[i] = byte(i)
		}
		for _, c := range []struct {
			name string
			hs   []outbox.Header
		}{
			{"One", []outbox.Header{{Key: "k", Value: []byte("v")}}},
			{"EmptyValue", []outbox.Header{{Key: "k", Value: []byte{}}}},
			{"NilValue", []outbox.Header{{Key: "k", Value: nil}}},
			{"EmptyKeyAndValue", []outbox.Header{{}}},
			{"Binary", []outbox.Header{{Key: string(binary), Value: binary}}},
			{"InvalidUTF8Key", []outbox.Header{{Key: "\xff\xfe", Value: []byte("\x00")}}},
			{"RepeatedKeys", []outbox.Header{{Key: "k", Value: []byte("1")}, {Key: "k", Value: []byte("2")}, {Key: "", Value: []byte("3")}}},
			{"Large", []outbox.Header{{Key: "big", Value: bytes.Repeat([]byte{0x80}, 1<<17)}}},
		} {
			t.Run(c.name, func(t *testing.T) {
				b := outbox.EncodeHeaders(c.hs)
				got, err := outbox.DecodeHeaders(b)
				if err != nil {
					t.Fatal(err)
				}
				if !sameHeaders(got, c.hs) {
					t.Fatalf("DecodeHeaders(EncodeHeaders(%+v)) = %+v", c.hs, got)
				}
			})
		}
	})

	t.Run("ValuesDoNotShareCapacity", func(t *testing.T) {
		b := outbox.EncodeHeaders([]outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}})
		hs, err := outbox.DecodeHeaders(b)
		if err != nil {
			t.Fatal(err)
		}
		// Appending to one value must not overwrite what follows it.
		_ = append(hs[0].Value, 'X')
		if hs[1].Key != "b" || string(hs[1].Value) != "2" {
			t.Fatalf("append to a value changed the next header: %+v", hs[1])
		}
	})

	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"ErrCountOverflowVarint", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"ErrCountTruncatedVarint", []byte{0x80}},
		{"ErrCountAboveLength", []byte{5, 0, 0}},
		{"ErrHugeCount", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}},
		{"ErrMissingKey", []byte{1}},
		{"ErrKeyTruncated", []byte{1, 3, 'a', 'b'}},
		{"ErrKeyLengthHuge", []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 'a'}},
		{"ErrMissingValue", []byte{1, 1, 'a'}},
		{"ErrValueTruncated", []byte{1, 1, 'a', 2, 'x'}},
		{"ErrValueLengthTruncatedVarint", []byte{1, 1, 'a', 0x80}},
		{"ErrFewerHeadersThanCount", []byte{2, 1, 'a', 1, 'x'}},
		{"ErrTrailingBytes", []byte{1, 1, 'a', 1, 'x', 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			hs, err := outbox.DecodeHeaders(c.b)
			if err == nil {
				t.Fatalf("DecodeHeaders(%x) = %+v, no error", c.b, hs)
			}
			if err.Error() != "decode headers: truncated or corrupt" {
				t.Fatalf("error = %q", err)
			}
			if hs != nil {
				t.Fatalf("headers = %+v with an error", hs)
			}
		})
	}

	t.Run("ErrEveryTruncation", func(t *testing.T) {
		b := outbox.EncodeHeaders([]outbox.Header{{Key: "key", Value: []byte("value")}, {Key: "k2", Value: bytes.Repeat([]byte{1}, 200)}})
		for i := 1; i < len(b); i++ {
			if hs, err := outbox.DecodeHeaders(b[:i]); err == nil {
				t.Fatalf("DecodeHeaders of the first %d of %d bytes = %+v, no error", i, len(b), hs)
			}
		}
	})
}

// FuzzDecodeHeaders: decoding arbitrary bytes never panics, and whatever
// decodes survives an encode and decode unchanged.
func FuzzDecodeHeaders(f *testing.F) {
	f.Add([]byte(nil))
	f.Add([]byte{0})
	f.Add([]byte{2, 2, 'a', 'b', 1, 0xff, 0, 0})
	f.Add([]byte{1, 0x80, 0x00, 0})                                     // non-minimal varint
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}) // huge count
	f.Add(outbox.EncodeHeaders([]outbox.Header{{Key: "k", Value: bytes.Repeat([]byte{'v'}, 200)}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := outbox.DecodeHeaders(b)
		if err != nil {
			if hs != nil {
				t.Fatalf("headers %+v with error %v", hs, err)
			}
			return
		}
		again, err := outbox.DecodeHeaders(outbox.EncodeHeaders(hs))
		if err != nil {
			t.Fatalf("re-encoded %+v does not decode: %v", hs, err)
		}
		if !sameHeaders(again, hs) {
			t.Fatalf("round trip changed %+v into %+v", hs, again)
		}
	})
}
