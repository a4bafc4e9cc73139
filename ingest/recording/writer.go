package recording

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
	w := &Writer{f: f, path: path, size: int64(len(start))}
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
	w.buf = appendItem(w.buf, r, d, o)
}

// Control adds an epoch change or a loss to the transaction.
func (w *Writer) Control(r ingest.Record) {
	if r.Kind == ingest.RecordEpoch {
		w.buf = appendEpoch(w.buf, r)
	} else {
		w.buf = appendLoss(w.buf, r)
	}
}

// Discard drops the transaction's records: it did not commit.
func (w *Writer) Discard() { w.buf = w.buf[:0] }

// maxKeptBuffer is the largest transaction buffer kept for the next one.
const maxKeptBuffer = 4 << 20

// Prepare writes the transaction's records and its prepare frame, with
// the checkpoints it stores: call it right before the store's COMMIT.
func (w *Writer) Prepare(cps map[int32]outbox.Checkpoint) error {
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

// Close syncs and closes the file.
func (w *Writer) Close() error {
	serr := w.f.Sync()
	cerr := w.f.Close()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("close recording %s: %w", w.path, err)
	}
	return nil
}
