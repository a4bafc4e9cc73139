package outbox

import (
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/pierrec/lz4/v4"
	"modernc.org/sqlite"
)

// The outbox is stored packed. A chunk (a row of outbox_chunks) holds a
// run of outputs of one transaction that share their feed, partition,
// epoch and topic, at most chunkMaxRows of them, with consecutive ids: the
// chunk's last_id and the count before it. What differs between its
// outputs (position, n, key, value, headers) is its body, output after
// output. SQLite's work for a row (a b-tree cell, a record to build, a
// statement's steps) is then paid once per chunk instead of once per
// output, and the texts the outputs share are stored once: a tenth of the
// SQLite time of writing each output as a row of its own, for short
// outputs. The view outbox shows one row per output, as the table of that
// name did (see schema.sql).
//
// A body is a byte saying how the outputs are stored, then the outputs:
// bodyRaw as they are, bodyLZ4 as an LZ4 block (github.com/pierrec/lz4)
// after their length (uvarint). Bodies of bodyCompressMin bytes or more are
// compressed when that saves a tenth of them. An output is:
//
//	position   zigzag varint
//	n          uvarint
//	key        uvarint length+1 (0: NULL), then the bytes
//	value      the same
//	headers    the same (EncodeHeaders form)
const (
	// chunkMaxRows is the most outputs of a chunk; the view's slots
	// (outbox_slots) must number at least as many.
	chunkMaxRows = 64
	// chunkMaxBody bounds a chunk's body, but not below one output: four
	// chunks fit a 16 KiB page, so a page holds little slack (a bound of
	// a page's half left half the pages empty with 120-byte outputs,
	// TestStore_BacklogBytesOnDisk).
	chunkMaxBody = 3900
)

// The body formats.
const (
	bodyRaw = 0
	bodyLZ4 = 1
)

// bodyCompressMin is the smallest body worth compressing.
const bodyCompressMin = 256

// ErrBadChunk marks a chunk whose body does not decode: a damaged
// database.
var ErrBadChunk = errors.New("outbox chunk does not decode")

// compressor compresses chunk bodies, and learns to stop trying where
// outputs do not compress: LZ4 spends about a microsecond a kilobyte to
// find that out. After a body that did not compress it skips the next
// ones, twice as many after each further failure (at most
// maxCompressSkip), and tries every body again after one that compressed.
type compressor struct {
	never  bool            // leave every body raw (PostgreSQL's view decodes raw bodies only)
	c      *lz4.Compressor // made at the first body worth compressing: it holds a 64 KiB table
	z      []byte          // the compressed body, reused
	skip   int             // bodies to leave as they are before trying again
	misses int             // bodies that did not compress in a row
}

// maxCompressSkip bounds the bodies skipped after failures in a row.
const maxCompressSkip = 64

// body compresses the outputs at body[from+1:] in place when that saves a
// tenth of them, setting the format byte at body[from].
func (c *compressor) body(body []byte, from int) []byte {
	raw := body[from+1:]
	if c.never || len(raw) < bodyCompressMin {
		return body
	}
	if c.skip > 0 {
		c.skip--
		return body
	}
	if c.c == nil {
		c.c = new(lz4.Compressor)
	}
	c.z = slices.Grow(c.z[:0], lz4.CompressBlockBound(len(raw))+binary.MaxVarintLen64)
	z := binary.AppendUvarint(c.z, uint64(len(raw)))
	n, err := c.c.CompressBlock(raw, z[len(z):cap(z)])
	if err != nil || n == 0 || len(z)+n > len(raw)*9/10 {
		c.misses++
		c.skip = min(1<<min(c.misses-1, 6), maxCompressSkip)
		return body
	}
	c.misses = 0
	z = z[:len(z)+n]
	body = append(body[:from], bodyLZ4)
	return append(body, z...)
}

// outputsOf returns the outputs of a body, decompressed into a new array
// when they are compressed.
func outputsOf(body []byte) ([]byte, error) {
	if len(body) == 0 {
		return nil, ErrBadChunk
	}
	switch body[0] {
	case bodyRaw:
		return body[1:], nil
	case bodyLZ4:
		l, n := binary.Uvarint(body[1:])
		// LZ4 expands at most 255 times: a length past that is damage,
		// not a size to allocate.
		if n <= 0 || l > maxOutputsBytes || l > 255*uint64(len(body))+64 {
			return nil, ErrBadChunk
		}
		out := make([]byte, l)
		m, err := lz4.UncompressBlock(body[1+n:], out)
		if err != nil || uint64(m) != l {
			return nil, ErrBadChunk
		}
		return out, nil
	}
	return nil, ErrBadChunk
}

// maxOutputsBytes bounds what a compressed body may claim to hold.
const maxOutputsBytes = 1 << 31

// appendOutput appends r's own fields to a chunk body.
func appendOutput(b []byte, r *Row) []byte {
	b = binary.AppendVarint(b, r.Position)
	b = binary.AppendUvarint(b, uint64(r.N))
	b = appendField(b, r.Key)
	b = appendField(b, r.Value)
	return appendField(b, r.Headers)
}

func appendField(b, f []byte) []byte {
	if f == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(f))+1)
	return append(b, f...)
}

// outputBytes is what appendOutput appends for r.
func outputBytes(r *Row) int {
	return varintLen(zigzag(r.Position)) + varintLen(uint64(r.N)) +
		fieldBytes(r.Key) + fieldBytes(r.Value) + fieldBytes(r.Headers)
}

func fieldBytes(f []byte) int {
	if f == nil {
		return 1
	}
	return varintLen(uint64(len(f))+1) + len(f)
}

func zigzag(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

func varintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// chunkReader reads the outputs of one body in order.
type chunkReader struct {
	b   []byte
	err error
}

func (c *chunkReader) next(r *Row) bool {
	if c.err != nil || len(c.b) == 0 {
		return false
	}
	pos, n := binary.Varint(c.b)
	if n <= 0 {
		c.err = ErrBadChunk
		return false
	}
	c.b = c.b[n:]
	k, n := binary.Uvarint(c.b)
	if n <= 0 || k > 1<<31 {
		c.err = ErrBadChunk
		return false
	}
	c.b = c.b[n:]
	r.Position, r.N = pos, int(k)
	r.Key, r.Value, r.Headers = c.field(), c.field(), c.field()
	return c.err == nil
}

// field reads one length-prefixed field: a slice of the body itself (the
// caller's copy), nil for NULL, empty (not nil) for an empty one.
func (c *chunkReader) field() []byte {
	if c.err != nil {
		return nil
	}
	l, n := binary.Uvarint(c.b)
	if n <= 0 || l > uint64(len(c.b)-n)+1 {
		c.err = ErrBadChunk
		return nil
	}
	c.b = c.b[n:]
	if l == 0 {
		return nil
	}
	f := c.b[: l-1 : l-1]
	c.b = c.b[l-1:]
	return f
}

// chunkHead is a chunk's columns but its body.
type chunkHead struct {
	lastID    int64
	count     int
	feed      string
	partition int32
	epoch     string
	topic     string
	createdAt int64
}

// appendChunkRows appends the outputs of a chunk with ids above after, at
// most limit of them, decoded from body (which the rows then share).
func appendChunkRows(dst []Row, h *chunkHead, body []byte, after int64, limit int) ([]Row, error) {
	first := h.lastID - int64(h.count) + 1
	outs, err := outputsOf(body)
	if err != nil {
		return dst, fmt.Errorf("outbox chunk ending at id %d: %w", h.lastID, err)
	}
	c := chunkReader{b: outs}
	r := Row{Feed: h.feed, Partition: h.partition, Epoch: h.epoch, Topic: h.topic, CreatedAt: h.createdAt}
	i := 0
	for ; c.next(&r); i++ {
		if r.ID = first + int64(i); r.ID > after && limit > 0 {
			dst = append(dst, r)
			limit--
		}
	}
	if c.err != nil || i != h.count {
		return dst, fmt.Errorf("outbox chunk ending at id %d (%d outputs, %d decoded): %w", h.lastID, h.count, i, ErrBadChunk)
	}
	return dst, nil
}

// The SQL functions of the packed outbox, registered with the driver for
// every connection: outbox_output encodes one output as a body (the
// migration from a row per output), outbox_field reads field f (0
// position, 1 n, 2 key, 3 value, 4 headers) of output i of a body (the
// view outbox).
func init() {
	sqlite.MustRegisterDeterministicScalarFunction("outbox_output", 5,
		func(_ *sqlite.FunctionContext, a []driver.Value) (driver.Value, error) {
			pos, ok1 := a[0].(int64)
			n, ok2 := a[1].(int64)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("outbox_output: position and n must be integers, not %T and %T", a[0], a[1])
			}
			r := Row{Position: pos, N: int(n), Key: blobValue(a[2]), Value: blobValue(a[3]), Headers: blobValue(a[4])}
			return appendOutput([]byte{bodyRaw}, &r), nil
		})
	sqlite.MustRegisterDeterministicScalarFunction("outbox_field", 3,
		func(_ *sqlite.FunctionContext, a []driver.Value) (driver.Value, error) {
			body, err := outputsOf(blobValue(a[0]))
			if err != nil {
				return nil, err
			}
			i, ok1 := a[1].(int64)
			f, ok2 := a[2].(int64)
			if !ok1 || !ok2 || f < 0 || f > 4 {
				return nil, errors.New("outbox_field: want a body, an output's index and a field from 0 to 4")
			}
			c := chunkReader{b: body}
			var r Row
			for k := int64(0); k <= i; k++ {
				if !c.next(&r) {
					if c.err != nil {
						return nil, c.err
					}
					return nil, nil // past the chunk's outputs
				}
			}
			switch f {
			case 0:
				return r.Position, nil
			case 1:
				return int64(r.N), nil
			case 2:
				return blobResult(r.Key), nil
			case 3:
				return blobResult(r.Value), nil
			}
			return blobResult(r.Headers), nil
		})
}

// blobResult is f as a function result: NULL for nil, a copy otherwise.
func blobResult(f []byte) driver.Value {
	if f == nil {
		return nil
	}
	return append([]byte{}, f...)
}
