package recording

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/outboxd/outboxd/outbox"
)

// Txn is one recorded transaction: its records in the order the loop
// handled them, and the checkpoints of every partition once it committed.
type Txn struct {
	Number      uint64
	Entries     []Entry
	Checkpoints map[int32]outbox.Checkpoint
	// Offset is where its first frame starts in the file.
	Offset int64
}

// Tail is what a reader found after the last committed transaction.
type Tail struct {
	// Offset is where it starts, Bytes how long it is (0: nothing).
	Offset, Bytes int64
	// Unconfirmed is a transaction whose records and checkpoints were
	// written before the store's COMMIT, with no commit frame after them:
	// the process stopped during the COMMIT, which may or may not have
	// happened. The next recording of the feed tells (see Replay).
	Unconfirmed *Txn
	// Torn says why the bytes after the last whole transaction (and after
	// Unconfirmed) could not be read: a frame cut short. "" when they
	// could. A crash leaves such a tail; it never leaves a frame whose
	// bytes are not those written (a checksum that does not match), which
	// is damage (ErrCorrupt).
	Torn string
	// TornOffset is where the bytes Torn is about start: Offset, or,
	// after Unconfirmed, the end of its prepare record (its commit record
	// is what was cut).
	TornOffset int64
	// Next names the part that follows this one (its file name, NextPart
	// its number) when the file ends by naming it; Ended is set when the
	// file ends the run. A file with neither is the last of a run that
	// stopped without ending it (a kill), or one whose end is lost.
	// EndOffset is where the frame that says so starts.
	Next      string
	NextPart  int
	Ended     bool
	EndOffset int64
}

// Reader reads a recording file. It is not safe for concurrent use.
type Reader struct {
	name  string
	ra    io.ReaderAt
	size  int64
	br    *bufio.Reader
	off   int64 // where the next frame starts
	hdr   Header
	in    interner
	body  []byte
	close func() error

	pending    []Entry // records of the transaction being read
	pendingOff int64
	prepared   *Txn   // read up to its prepare frame
	last       uint64 // the last transaction committed
	tail       *Tail  // set at the end
	// closed is set by the frame that ends the part (kindNext or
	// kindEnd), at closedAt; what it says is kept for the tail.
	closed   bool
	closedAt int64
	nextName string
	nextPart int
	ended    bool
}

// Open opens the recording at path and reads its header. It fails with an
// error wrapping ErrNotRecording, ErrVersion or ErrBadRecord when the file
// is not a recording this package reads.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open recording: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open recording: %w", err)
	}
	r, err := NewReader(path, f, st.Size())
	if err != nil {
		f.Close()
		return nil, err
	}
	r.close = f.Close
	return r, nil
}

// NewReader reads the recording held by ra, size bytes long; name names
// it in errors.
func NewReader(name string, ra io.ReaderAt, size int64) (*Reader, error) {
	r := &Reader{name: name, ra: ra, size: size, in: interner{}, close: func() error { return nil }}
	r.br = bufio.NewReaderSize(io.NewSectionReader(ra, 0, size), 1<<16)
	if err := r.readStart(); err != nil {
		return nil, fmt.Errorf("recording %s: %w", name, err)
	}
	return r, nil
}

// readStart reads the magic, the version and the header frame.
func (r *Reader) readStart() error {
	start := make([]byte, len(Magic)+2)
	if _, err := io.ReadFull(r.br, start); err != nil || string(start[:len(Magic)]) != Magic {
		return ErrNotRecording
	}
	if v := binary.BigEndian.Uint16(start[len(Magic):]); v != Version {
		// Version 1 had no frame to end a part: its damage at the end
		// could not be told from a crash.
		return fmt.Errorf("%w %d: this outboxd reads version %d", ErrVersion, v, Version)
	}
	r.off = int64(len(start))
	kind, body, err := r.readFrame()
	if err != nil {
		return fmt.Errorf("%w: the header cannot be read: %v", ErrBadRecord, err)
	}
	if kind != kindHeader {
		return fmt.Errorf("%w: the first record is not the header", ErrBadRecord)
	}
	r.hdr, err = decodeHeader(body)
	return err
}

// Header is the recording's header.
func (r *Reader) Header() Header { return r.hdr }

// Name is the recording's name, as given to NewReader (the path for Open).
func (r *Reader) Name() string { return r.name }

// Close closes the file.
func (r *Reader) Close() error { return r.close() }

// Tail says what followed the last committed transaction; it is set once
// Next has returned io.EOF.
func (r *Reader) Tail() Tail {
	if r.tail == nil {
		return Tail{}
	}
	return *r.tail
}

// frameError is a frame that cannot be read: the torn tail a crash leaves,
// or damage. cut says the file ends inside it; kind is its kind when the
// file holds that byte, else 0.
type frameError struct {
	why  string
	cut  bool
	kind byte
}

func (e *frameError) Error() string { return e.why }

// Next returns the next committed transaction. At the end it returns
// io.EOF, and Tail says what was after the last one. It fails with an
// error wrapping ErrCorrupt when a damaged frame is followed by whole
// ones, or ErrBadRecord for a whole frame the format does not allow;
// nothing it returned before is wrong.
func (r *Reader) Next() (Txn, error) {
	if r.tail != nil {
		return Txn{}, io.EOF
	}
	for {
		at := r.off
		kind, body, err := r.readFrame()
		if err != nil {
			return Txn{}, r.end(at, err)
		}
		txn, ok, err := r.take(at, kind, body)
		if err != nil {
			return Txn{}, fmt.Errorf("recording %s: record at offset %d: %w", r.name, at, err)
		}
		if ok {
			return txn, nil
		}
	}
}

// take handles one whole frame; ok says a transaction is complete.
func (r *Reader) take(at int64, kind byte, body []byte) (Txn, bool, error) {
	if r.closed {
		return Txn{}, false, fmt.Errorf("%w: a record after the end of the part at offset %d", ErrBadRecord, r.closedAt)
	}
	switch kind {
	case kindNext, kindEnd:
		if len(r.pending) > 0 {
			return Txn{}, false, fmt.Errorf("%w: the part ends inside a transaction", ErrBadRecord)
		}
		// A transaction prepared and not committed before the end: its
		// COMMIT failed, and the loop stopped or the part was closed
		// after it.
		r.prepared = nil
		r.closed, r.closedAt = true, at
		if kind == kindNext {
			part, name, err := decodeNext(body)
			if err != nil || part != r.hdr.Part+1 {
				return Txn{}, false, fmt.Errorf("%w: part %d names part %d as its successor (%v)", ErrBadRecord, r.hdr.Part, part, err)
			}
			r.nextPart, r.nextName = part, name
			return Txn{}, false, nil
		}
		part, _, off, err := decodeEnd(body)
		if err != nil || part != r.hdr.Part || off != at {
			return Txn{}, false, fmt.Errorf("%w: the end of part %d at offset %d says part %d at offset %d (%v)",
				ErrBadRecord, r.hdr.Part, at, part, off, err)
		}
		r.ended = true
		return Txn{}, false, nil
	case kindItem, kindEpoch, kindLoss:
		e, err := r.decodeEntry(kind, body)
		if err != nil {
			return Txn{}, false, fmt.Errorf("%w: %v", ErrBadRecord, err)
		}
		if r.prepared != nil { // its COMMIT failed: the loop tries again
			r.prepared = nil
		}
		if len(r.pending) == 0 {
			r.pendingOff = at
		}
		r.pending = append(r.pending, e)
		return Txn{}, false, nil
	case kindPrepare:
		n, cps, err := decodePrepare(body)
		if err != nil || n <= r.last {
			return Txn{}, false, fmt.Errorf("%w: prepare of transaction %d after %d (%v)", ErrBadRecord, n, r.last, err)
		}
		off := at
		if len(r.pending) > 0 {
			off = r.pendingOff
		}
		r.prepared = &Txn{Number: n, Entries: r.pending, Checkpoints: cps, Offset: off}
		r.pending = nil
		return Txn{}, false, nil
	case kindCommit:
		n, err := decodeCommit(body)
		if err != nil || r.prepared == nil || r.prepared.Number != n {
			return Txn{}, false, fmt.Errorf("%w: commit of transaction %d not right after its prepare", ErrBadRecord, n)
		}
		txn := *r.prepared
		r.prepared, r.last = nil, n
		return txn, true, nil
	case kindHeader:
		return Txn{}, false, fmt.Errorf("%w: a second header", ErrBadRecord)
	}
	return Txn{}, false, fmt.Errorf("%w: unknown record kind %q", ErrBadRecord, kind)
}

func (r *Reader) decodeEntry(kind byte, body []byte) (Entry, error) {
	switch kind {
	case kindItem:
		return decodeItem(body, r.hdr.Feed, r.in)
	case kindEpoch:
		return decodeEpoch(body, r.in)
	}
	return decodeLoss(body, r.in)
}

// end finishes the file at offset at, where err stopped the reading: the
// end of the file, or a frame that cannot be read. It returns io.EOF, or
// the error of a damaged file.
func (r *Reader) end(at int64, err error) error {
	var fe *frameError
	if !errors.Is(err, io.EOF) && !errors.As(err, &fe) {
		return fmt.Errorf("recording %s: read at offset %d: %w", r.name, at, err)
	}
	if fe != nil {
		if next, ok := r.wholeFrameAfter(at); ok {
			return fmt.Errorf("recording %s: %w: offset %d: %s, yet a whole record follows at offset %d",
				r.name, ErrCorrupt, at, fe.why, next)
		}
		if why := damage(fe, r.closed, r.closedAt); why != "" {
			return fmt.Errorf("recording %s: %w: offset %d: %s", r.name, ErrCorrupt, at, why)
		}
	}
	t := &Tail{Offset: at, Unconfirmed: r.prepared, Next: r.nextName, NextPart: r.nextPart, Ended: r.ended}
	if r.closed {
		t.EndOffset = r.closedAt
	}
	switch {
	case r.prepared != nil:
		t.Offset = r.prepared.Offset
	case len(r.pending) > 0:
		t.Offset = r.pendingOff
	}
	t.Bytes = r.size - t.Offset
	switch {
	case fe != nil:
		t.Torn, t.TornOffset = fe.why, t.Offset
		if r.prepared != nil {
			t.TornOffset = at
		}
	case len(r.pending) > 0:
		t.Torn, t.TornOffset = fmt.Sprintf("%d records of a transaction that has no prepare record", len(r.pending)), t.Offset
	}
	r.tail, r.pending, r.prepared = t, nil, nil
	return io.EOF
}

// damage says why fe, which ends a file, is not a tail a crash can leave
// ("" when it is). A crash stops the writer between two writes, or cuts
// a write short: it never changes bytes written (a frame whose checksum
// does not match, or that does not start as a frame does), never cuts a
// part's end (written whole by a write of a few bytes of its own, after
// the last commit), and writes nothing after a part's end.
func damage(fe *frameError, closed bool, closedAt int64) string {
	switch {
	case closed:
		return fmt.Sprintf("%s after the end of the part at offset %d", fe.why, closedAt)
	case !fe.cut:
		return fe.why + ": a crash cuts a record short, it does not change one"
	case fe.kind == kindNext || fe.kind == kindEnd:
		return fmt.Sprintf("a %s record cut short, which is written after the last transaction, whole, by a write of its own: a crash does not cut it",
			kindName(fe.kind))
	}
	return ""
}

// kindName names a frame kind in messages.
func kindName(k byte) string {
	switch k {
	case kindNext:
		return "next-part"
	case kindEnd:
		return "end-of-run"
	}
	return string(k)
}

// readFrame reads the frame at r.off: its kind and payload (valid until
// the next call). At the end of the file it returns io.EOF; a frame that
// cannot be read is a *frameError.
func (r *Reader) readFrame() (byte, []byte, error) {
	var head [frameHead]byte
	n, err := io.ReadFull(r.br, head[:])
	switch {
	case n == 0 && errors.Is(err, io.EOF):
		return 0, nil, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return 0, nil, &frameError{why: "a record cut short", cut: true}
	case err != nil:
		return 0, nil, err
	}
	if head[0] != sync0 || head[1] != sync1 {
		return 0, nil, &frameError{why: "not the start of a record"}
	}
	length := binary.BigEndian.Uint32(head[:][2:])
	switch {
	case length > maxFrame:
		return 0, nil, &frameError{why: "not the start of a record"}
	case int64(length) > r.size-r.off-frameHead:
		// Never allocated: the file cannot hold it.
		fe := &frameError{why: "a record cut short", cut: true}
		var k [1]byte
		if _, err := r.ra.ReadAt(k[:], r.off+frameHead); err == nil {
			fe.kind = k[0]
		}
		return 0, nil, fe
	}
	if cap(r.body) < int(length) {
		r.body = make([]byte, length)
	}
	body := r.body[:length]
	if _, err := io.ReadFull(r.br, body); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return 0, nil, &frameError{why: "a record cut short", cut: true}
		}
		return 0, nil, err
	}
	if frameCRC(body) != binary.BigEndian.Uint32(head[6:]) {
		return 0, nil, &frameError{why: "a record whose checksum does not match"}
	}
	r.off += frameHead + int64(length)
	if length == 0 {
		return 0, nil, &frameError{why: "an empty record"}
	}
	return body[0], body[1:], nil
}

// maxScanFrame bounds the frames wholeFrameAfter checks: larger lengths,
// at random offsets, are all but certainly not frames, and reading them
// would cost a lot.
const maxScanFrame = 64 << 20

// wholeFrameAfter looks for a whole frame (sync, length, checksum, a
// known kind) starting after offset at: damage followed by whole records
// is not a torn tail.
func (r *Reader) wholeFrameAfter(at int64) (int64, bool) {
	const chunk = 1 << 20
	buf := make([]byte, chunk+frameHead)
	for base := at + 1; base+frameHead <= r.size; base += chunk {
		n, err := r.ra.ReadAt(buf, base)
		if n == 0 && err != nil {
			return 0, false
		}
		window := buf[:n]
		for i := 0; i+frameHead <= len(window) && i < chunk; {
			j := bytes.IndexByte(window[i:], sync0)
			if j < 0 {
				break
			}
			i += j
			if i+frameHead <= len(window) && r.frameAt(base+int64(i), window[i:i+frameHead]) {
				return base + int64(i), true
			}
			i++
		}
	}
	return 0, false
}

// frameAt reports whether a whole frame starts at off, head being its
// first bytes.
func (r *Reader) frameAt(off int64, head []byte) bool {
	if head[1] != sync1 {
		return false
	}
	length := binary.BigEndian.Uint32(head[2:])
	if length == 0 || length > maxScanFrame || int64(length) > r.size-off-frameHead {
		return false
	}
	body := make([]byte, length)
	if _, err := r.ra.ReadAt(body, off+frameHead); err != nil {
		return false
	}
	switch body[0] {
	case kindItem, kindEpoch, kindLoss, kindPrepare, kindCommit, kindNext, kindEnd:
	default:
		return false
	}
	return frameCRC(body) == binary.BigEndian.Uint32(head[6:])
}
