package outbox

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
)

// randomRows makes n rows of one origin with keys, values and headers that
// are NULL, empty, short, long, compressible or not.
func randomRows(rng *rand.Rand, n int) []Row {
	field := func() []byte {
		switch rng.IntN(6) {
		case 0:
			return nil
		case 1:
			return []byte{}
		case 2:
			return bytes.Repeat([]byte("ab"), 1+rng.IntN(800)) // compresses
		}
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	rows := make([]Row, n)
	for i := range rows {
		rows[i] = Row{Feed: "f", Partition: 2, Epoch: "e", Topic: "t", Position: rng.Int64N(1<<40) - 1<<39,
			N: rng.IntN(3), Key: field(), Value: field(), Headers: field()}
	}
	return rows
}

// Rows packed as Commit packs them decode to the same rows, whether their
// chunks were compressed or not, and chunks hold what they should: one
// origin, at most chunkMaxRows, at most chunkMaxBody of raw body unless
// one row alone is larger.
func TestChunk_RoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	compressed, raw := 0, 0
	for round := range 50 {
		rows := randomRows(rng, 1+rng.IntN(300))
		if round%5 == 0 {
			rows[len(rows)/2].Topic = "u" // a second origin ends a chunk
		}
		var z compressor
		next, body, spans := packRows(rows, 0, len(rows), nil, nil, &z)
		if next != len(rows) {
			t.Fatalf("packed %d of %d rows", next, len(rows))
		}
		var got []Row
		id := int64(100)
		for _, sp := range spans {
			if sp.n < 1 || sp.n > chunkMaxRows {
				t.Fatalf("a chunk of %d rows", sp.n)
			}
			b := body[sp.from:sp.to]
			if b[0] == bodyLZ4 {
				compressed++
			} else {
				raw++
			}
			outs, err := outputsOf(b)
			if err != nil {
				t.Fatal(err)
			}
			if sp.n > 1 && len(outs) > chunkMaxBody {
				t.Fatalf("a chunk of %d rows has %d bytes of outputs", sp.n, len(outs))
			}
			first := &rows[sp.start]
			id += int64(sp.n)
			h := chunkHead{lastID: id, count: sp.n, feed: first.Feed, partition: first.Partition, epoch: first.Epoch, topic: first.Topic}
			if got, err = appendChunkRows(got, &h, b, 0, sp.n); err != nil {
				t.Fatal(err)
			}
		}
		for i := range rows {
			want := rows[i]
			want.ID = 101 + int64(i)
			if !reflect.DeepEqual(got[i], want) {
				t.Fatalf("round %d row %d:\n got %+v\nwant %+v", round, i, got[i], want)
			}
		}
	}
	if compressed == 0 || raw == 0 {
		t.Fatalf("%d compressed and %d raw chunks: want both", compressed, raw)
	}
}

// A damaged body is an error naming the chunk, never a panic or rows made
// up.
func TestChunk_Damaged(t *testing.T) {
	rows := randomRows(rand.New(rand.NewPCG(5, 6)), 40)
	var z compressor
	_, body, spans := packRows(rows, 0, len(rows), nil, nil, &z)
	b := body[spans[0].from:spans[0].to]
	h := chunkHead{lastID: int64(spans[0].n), count: spans[0].n}
	for _, bad := range [][]byte{nil, {7}, b[:len(b)/2], append(append([]byte{}, b...), 0)} {
		if _, err := appendChunkRows(nil, &h, bad, 0, h.count); !errors.Is(err, ErrBadChunk) {
			t.Errorf("body of %d bytes: %v, want ErrBadChunk", len(bad), err)
		}
	}
	h.count++ // a count the body does not hold
	if _, err := appendChunkRows(nil, &h, b, 0, h.count); !errors.Is(err, ErrBadChunk) {
		t.Errorf("count one more than the body holds: %v, want ErrBadChunk", err)
	}
}

// FuzzChunk_Decode: no body makes decoding panic.
func FuzzChunk_Decode(f *testing.F) {
	var z compressor
	_, body, _ := packRows(randomRows(rand.New(rand.NewPCG(7, 8)), 20), 0, 20, nil, nil, &z)
	f.Add(body, 5)
	f.Add([]byte{bodyLZ4, 200, 1, 0}, 1)
	f.Fuzz(func(t *testing.T, b []byte, count int) {
		h := chunkHead{lastID: 100, count: max(1, count%70)}
		appendChunkRows(nil, &h, b, 0, h.count) //nolint:errcheck // any error will do, no panic
	})
}

// The compressor stops trying bodies that do not compress, a growing
// number of them after each failure (at most maxCompressSkip), and
// compresses every body again once one compressed.
func TestCompressor_Skips(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	body := func(compressible bool) []byte {
		b := []byte{bodyRaw}
		for range 1000 {
			if compressible {
				b = append(b, 'x')
			} else {
				b = append(b, byte(rng.UintN(256)))
			}
		}
		return b
	}
	var c compressor
	tried := 0
	for range 200 {
		before := c.misses
		if out := c.body(body(false), 0); out[0] != bodyRaw {
			t.Fatal("a random body was compressed")
		}
		if c.misses != before {
			tried++
		}
	}
	if tried < 5 || tried > 12 {
		t.Fatalf("%d of 200 incompressible bodies tried, want a few (skips doubling to %d)", tried, maxCompressSkip)
	}
	first := -1
	for i := range 100 {
		out := c.body(body(true), 0)
		switch {
		case out[0] == bodyLZ4 && first < 0:
			first = i
		case out[0] != bodyLZ4 && first >= 0:
			t.Fatalf("body %d not compressed after body %d was", i, first)
		}
	}
	if first < 0 || first > maxCompressSkip {
		t.Fatalf("the first compressible body compressed was the %d'th, want within %d", first, maxCompressSkip)
	}
}
