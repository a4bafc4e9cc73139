package recording

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Writer writes one recording file: the header, then transactions. It is
// not safe for concurrent use.
//
// A transaction's records are kept in memory until Prepare, which writes
// them and the prepare frame in one write; Commit writes the commit frame.
// Neither syncs to disk: a process crash loses nothing written, a power
// loss may lose the last transactions (the tail a reader reports).
type Writer struct {
	f    *os.File
	path string
	buf  []byte
	size int64
	txn  uint64
	// open is where the frame of an item begun (BeginItem) and not yet
	// ended starts in buf, -1 when there is none.
	open int
}

// Create writes a new recording file at path with header h. The file
// appears at path with its whole header, or not at all.
func Create(path string, h Header) (*Writer, error) {
	hb, err := encodeHeader(h)
	if err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create recording: %w", err)
	}
	start := binary.BigEndian.AppendUint16([]byte(Magic), Version)
	start = appendFrame(start, kindHeader, func(b []byte) []byte { return append(b, hb...) })
	w := &Writer{f: f, path: path, size: int64(len(start)), open: -1}
	if err := w.start(tmp, start); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	return w, nil
}

func (w *Writer) start(tmp string, start []byte) error {
	if _, err := w.f.Write(start); err != nil {
		return fmt.Errorf("create recording %s: %w", w.path, err)
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("create recording %s: %w", w.path, err)
	}
	if _, err := os.Lstat(w.path); err == nil {
		return fmt.Errorf("create recording %s: the file exists", w.path)
	}
	if err := os.Rename(tmp, w.path); err != nil {
		return fmt.Errorf("create recording %s: %w", w.path, err)
	}
	return outbox.SyncDir(filepath.Dir(w.path))
}

// Path is the file's path.
func (w *Writer) Path() string { return w.path }

// Size is the bytes written to the file so far.
func (w *Writer) Size() int64 { return w.size }

// Item adds an item with its delivery and outcome to the transaction.
func (w *Writer) Item(r ingest.Record, d ingest.Delivery, o ingest.Outcome) {
	w.DropItem()
	w.buf = appendItem(w.buf, r, d, o)
}

// BeginItem encodes an item and its delivery into the transaction at
// once, so that nothing of the feed's buffers is kept; EndItem adds its
// outcome. An item begun and not ended is dropped by the next BeginItem,
// Item or Discard.
func (w *Writer) BeginItem(r ingest.Record, d ingest.Delivery) {
	w.DropItem()
	w.open = len(w.buf)
	w.buf = appendItemHead(w.buf, r, d)
}

// EndItem adds the outcome of the item begun, ending its frame; it
// reports false when no item was begun.
func (w *Writer) EndItem(o ingest.Outcome) bool {
	if w.open < 0 {
		return false
	}
	w.buf = endFrame(appendItemOutcome(w.buf, o), w.open)
	w.open = -1
	return true
}

// DropItem drops the item begun and not ended, if any.
func (w *Writer) DropItem() {
	if w.open >= 0 {
		w.buf = w.buf[:w.open]
		w.open = -1
	}
}

// Control adds an epoch change or a loss to the transaction. One that
// comes while an item is begun goes before it, as the item's frame is
// written once its outcome is known.
func (w *Writer) Control(r ingest.Record) {
	var held []byte
	if w.open >= 0 {
		held = slices.Clone(w.buf[w.open:])
		w.buf = w.buf[:w.open]
	}
	if r.Kind == ingest.RecordEpoch {
		w.buf = appendEpoch(w.buf, r)
	} else {
		w.buf = appendLoss(w.buf, r)
	}
	if held != nil {
		w.open = len(w.buf)
		w.buf = append(w.buf, held...)
	}
}

// Discard drops the transaction's records: it did not commit.
func (w *Writer) Discard() { w.buf, w.open = w.buf[:0], -1 }

// maxKeptBuffer is the largest transaction buffer kept for the next one.
const maxKeptBuffer = 4 << 20

// Prepare writes the transaction's records and its prepare frame, with
// the checkpoints it stores: call it right before the store's COMMIT.
func (w *Writer) Prepare(cps map[int32]outbox.Checkpoint) error {
	w.DropItem() // no outcome came: not part of the transaction
	w.txn++
	w.buf = appendPrepare(w.buf, w.txn, cps)
	err := w.write(w.buf)
	if cap(w.buf) > maxKeptBuffer {
		w.buf = nil
	} else {
		w.buf = w.buf[:0]
	}
	return err
}

// Commit writes the commit frame of the transaction last prepared: call
// it once the store's COMMIT succeeded.
func (w *Writer) Commit() error {
	var b [frameHead + 1 + binary.MaxVarintLen64]byte
	return w.write(appendCommit(b[:0], w.txn))
}

func (w *Writer) write(b []byte) error {
	n, err := w.f.Write(b)
	w.size += int64(n)
	if err != nil {
		return fmt.Errorf("write recording %s: %w", w.path, err)
	}
	return nil
}

// Next writes the frame that ends this part, naming the part that
// follows it (its number and file name): call it before Close when the
// run goes on in another file.
func (w *Writer) Next(part int, name string) error {
	return w.write(appendNext(nil, part, name))
}

// End writes the frame that ends the run (the header's part is the
// run's last): call it before Close when the run ends. A file without it
// or a Next is a run that stopped without ending: killed.
func (w *Writer) End(part int) error {
	return w.write(appendEnd(nil, part, w.txn, w.size))
}

// Close syncs and closes the file.
func (w *Writer) Close() error {
	serr := w.f.Sync()
	cerr := w.f.Close()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("close recording %s: %w", w.path, err)
	}
	return nil
}
