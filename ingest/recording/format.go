// Package recording keeps what an ingest loop handled, to replay it: a
// Recorder writes, per run and feed, a recording file of every record the
// loop took in with its whole delivery and outcome, transaction by
// transaction; a Reader reads it back, refusing what it cannot read
// whole; Replay runs a recording through a real loop against a copy of
// the database, and Diff compares the result with another database.
//
// The file format is documented in docs/recording.md. In short: a magic
// and a format version, then frames, each length-prefixed with a CRC-32C;
// the first frame is the header (JSON), the others records (binary). The
// records of a transaction are written just before the store's COMMIT,
// followed by a prepare frame holding the checkpoints the commit stores,
// and a commit frame is written once the COMMIT succeeded. A reader yields
// only transactions whose commit frame it read, so a recording never
// claims a transaction the database does not hold; a prepared transaction
// without its commit frame (the process died during the COMMIT) is
// reported as unconfirmed, and a replay applies it only when the next
// recording of the feed starts right after it.
package recording

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Magic starts every recording file; the format version follows it, as
// two bytes big-endian.
const Magic = "OUTBOXD-RECORDING\n"

// Version is the format version this package writes and reads. Version
// 2 added the frames that end a part: the successor's name, or the run's
// end.
const Version = 2

// Frame layout: sync, length of the body (kind byte and payload), CRC-32C
// (Castagnoli) of the length's four bytes and the body, then the body.
const (
	sync0, sync1 = 0xA7, 0x4E
	frameHead    = 2 + 4 + 4
	// maxFrame bounds a frame's body, so a damaged length is never
	// believed past it: four times the largest Kafka record outboxd
	// takes (64 MiB). A recorder stops at an item it cannot record
	// within it (see MaxItemBytes).
	maxFrame = 256 << 20
)

// Frame kinds.
const (
	kindHeader  = 'H'
	kindItem    = 'I'
	kindEpoch   = 'E'
	kindLoss    = 'L'
	kindPrepare = 'P'
	kindCommit  = 'C'
	// kindNext ends a part whose run goes on in the next part, naming it;
	// kindEnd ends the run's last part when the run ended (a killed run
	// has neither).
	kindNext = 'N'
	kindEnd  = 'X'
)

// MaxItemBytes is the largest item (key, value and headers) a recording
// holds: a recorder meeting a larger one (a file line over 255 MiB) stops.
const MaxItemBytes = maxFrame - 1<<20

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Errors of a reader. A reader's error wraps one of them.
var (
	// ErrNotRecording: the file does not start with Magic.
	ErrNotRecording = errors.New("not an outboxd recording")
	// ErrVersion: the recording's format version is not Version.
	ErrVersion = errors.New("unknown recording format version")
	// ErrCorrupt: a frame is damaged, and frames follow it: not the torn
	// tail a crash leaves, but a file damaged in the middle.
	ErrCorrupt = errors.New("recording damaged")
	// ErrBadRecord: a whole frame (its checksum right) that this format
	// does not allow: an unknown kind, an item without its delivery, a
	// commit out of place.
	ErrBadRecord = errors.New("bad record")
)

// appendFrame appends a frame of kind whose payload body appends, and
// returns the buffer.
func appendFrame(buf []byte, kind byte, body func([]byte) []byte) []byte {
	start := len(buf)
	buf = appendFrameHead(buf, kind)
	return endFrame(body(buf), start)
}

// appendFrameHead appends the head of a frame of kind, its length and
// checksum left for endFrame.
func appendFrameHead(buf []byte, kind byte) []byte {
	return append(buf, sync0, sync1, 0, 0, 0, 0, 0, 0, 0, 0, kind)
}

// endFrame fills in the length and checksum of the frame that starts at
// start and ends at the end of buf.
func endFrame(buf []byte, start int) []byte {
	n := len(buf) - start - frameHead
	binary.BigEndian.PutUint32(buf[start+2:], uint32(n))
	crc := crc32.Update(0, crcTable, buf[start+2:start+6])
	crc = crc32.Update(crc, crcTable, buf[start+frameHead:])
	binary.BigEndian.PutUint32(buf[start+6:], crc)
	return buf
}

// frameCRC is the checksum of a frame with body b.
func frameCRC(b []byte) uint32 {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	return crc32.Update(crc32.Update(0, crcTable, n[:]), crcTable, b)
}

// Payload encoding: integers as varints (signed zig-zag), strings with a
// length, byte slices that may be nil with their length plus one (0 for
// nil).

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, v []byte) []byte {
	if v == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(v))+1)
	return append(b, v...)
}

// decoder reads a payload; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("payload cut short")

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail(errShort)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// raw returns the next n bytes, aliasing the payload.
func (d *decoder) raw(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail(errShort)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.raw(d.uvarint())) }

// bytes returns a copy of the next nullable byte slice.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n == 0 || d.err != nil {
		return nil
	}
	return append([]byte{}, d.raw(n-1)...)
}

// done fails unless the payload was read to its end.
func (d *decoder) done() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail(errors.New("bytes left over after the record"))
	}
	return d.err
}
