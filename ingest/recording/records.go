package recording

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Entry is one record of a recorded transaction: an item the loop took in
// with the delivery it was tried with and what came of it, an epoch change
// or a loss (Record.Kind says which).
type Entry struct {
	// Record is as the feed yielded it (an item's key, value, headers and
	// BadReason; an epoch change's epoch and position; a loss's range).
	Record ingest.Record
	// Delivery and Outcome are an item's. Delivery.Feed is the header's
	// feed.
	Delivery ingest.Delivery
	Outcome  ingest.Outcome
}

// appendItem appends an item's frame.
func appendItem(buf []byte, r ingest.Record, d ingest.Delivery, o ingest.Outcome) []byte {
	start := len(buf)
	buf = appendItemHead(buf, r, d)
	return endFrame(appendItemOutcome(buf, o), start)
}

// appendItemHead appends an item's frame up to its outcome: the frame's
// head, the delivery and the item.
func appendItemHead(buf []byte, r ingest.Record, d ingest.Delivery) []byte {
	b := appendFrameHead(buf, kindItem)
	b = binary.AppendVarint(b, int64(d.Partition))
	b = appendString(b, d.Topic)
	b = binary.AppendUvarint(b, uint64(d.Sequence))
	b = appendString(b, d.Epoch)
	b = binary.AppendVarint(b, d.Position)
	b = binary.AppendUvarint(b, uint64(d.Attempt))
	b = appendBytes(b, r.Item.Key)
	b = appendBytes(b, r.Item.Value)
	b = binary.AppendUvarint(b, uint64(len(r.Item.Headers)))
	for _, h := range r.Item.Headers {
		b = appendString(b, h.Key)
		b = appendBytes(b, h.Value)
	}
	b = appendString(b, r.BadReason)
	if r.BadErr != nil {
		b = appendBytes(b, []byte(r.BadErr.Error()))
	} else {
		b = appendBytes(b, nil)
	}
	return b
}

// appendItemOutcome appends the rest of an item's payload: its outcome.
func appendItemOutcome(b []byte, o ingest.Outcome) []byte {
	b = append(b, byte(o.Result))
	b = appendString(b, o.Reason)
	b = appendString(b, o.Error)
	b = binary.AppendUvarint(b, uint64(o.Attempts))
	return binary.AppendUvarint(b, uint64(o.DeadLetterID))
}

// appendEpoch appends an epoch change's frame.
func appendEpoch(buf []byte, r ingest.Record) []byte {
	return appendFrame(buf, kindEpoch, func(b []byte) []byte {
		b = binary.AppendVarint(b, int64(r.Partition))
		b = appendString(b, r.Epoch)
		return binary.AppendVarint(b, r.Position)
	})
}

// appendLoss appends a loss's frame.
func appendLoss(buf []byte, r ingest.Record) []byte {
	return appendFrame(buf, kindLoss, func(b []byte) []byte {
		b = binary.AppendVarint(b, int64(r.Partition))
		b = appendString(b, r.Epoch)
		b = binary.AppendVarint(b, r.From)
		b = binary.AppendVarint(b, r.To)
		return appendString(b, r.Reason)
	})
}

// appendPrepare appends the frame that closes a transaction's records:
// its number and the checkpoints of every partition once it commits.
func appendPrepare(buf []byte, txn uint64, cps map[int32]outbox.Checkpoint) []byte {
	return appendFrame(buf, kindPrepare, func(b []byte) []byte {
		b = binary.AppendUvarint(b, txn)
		b = binary.AppendUvarint(b, uint64(len(cps)))
		for _, p := range sortedPartitions(cps) {
			c := cps[p]
			b = binary.AppendVarint(b, int64(p))
			b = appendString(b, c.Epoch)
			b = binary.AppendVarint(b, c.Position)
		}
		return b
	})
}

// appendCommit appends the frame that says transaction txn committed.
func appendCommit(buf []byte, txn uint64) []byte {
	return appendFrame(buf, kindCommit, func(b []byte) []byte { return binary.AppendUvarint(b, txn) })
}

// interner keeps one copy of the strings records repeat (epochs, topics).
type interner map[string]string

func (in interner) get(b []byte) string {
	if s, ok := in[string(b)]; ok { // no allocation: the compiler looks up by the bytes
		return s
	}
	if len(in) > 1<<12 {
		clear(in) // a bound: epochs and topics are few, anything else is not worth keeping
	}
	s := string(b)
	in[s] = s
	return s
}

// decodeItem decodes an item's payload. feed is the header's feed.
func decodeItem(p []byte, feed string, in interner) (Entry, error) {
	d := decoder{b: p}
	var e Entry
	dl := &e.Delivery
	dl.Feed = feed
	dl.Partition = int32(d.varint())
	dl.Topic = in.get(d.raw(d.uvarint()))
	dl.Sequence = int64(d.uvarint())
	dl.Epoch = in.get(d.raw(d.uvarint()))
	dl.Position = d.varint()
	dl.Attempt = int(d.uvarint())
	r := &e.Record
	r.Kind, r.Partition, r.Topic, r.Epoch, r.Position = ingest.RecordItem, dl.Partition, dl.Topic, dl.Epoch, dl.Position
	r.Item.Key = d.bytes()
	r.Item.Value = d.bytes()
	n := d.uvarint()
	if n > uint64(len(d.b)) { // each header takes two bytes at least
		d.fail(errShort)
	}
	if n > 0 && d.err == nil {
		r.Item.Headers = make([]outbox.Header, n)
		for i := range r.Item.Headers {
			r.Item.Headers[i] = outbox.Header{Key: d.string(), Value: d.bytes()}
		}
	}
	r.BadReason = d.string()
	if msg := d.bytes(); msg != nil {
		r.BadErr = errors.New(string(msg))
	}
	o := &e.Outcome
	o.Result = ingest.Result(d.byte())
	o.Reason = d.string()
	o.Error = d.string()
	o.Attempts = int(d.uvarint())
	o.DeadLetterID = int64(d.uvarint())
	if err := d.done(); err != nil {
		return e, err
	}
	return e, checkItem(e)
}

// checkItem refuses an item that lacks its delivery: a replay without it
// would not be the recorded run.
func checkItem(e Entry) error {
	d, o := e.Delivery, e.Outcome
	switch {
	case o.Result < ingest.ResultApplied || o.Result > ingest.ResultSkipped:
		return fmt.Errorf("item with unknown outcome %d", o.Result)
	case d.Epoch == "":
		return errors.New("item without its delivery: no epoch")
	case d.Position < 0:
		return fmt.Errorf("item without its delivery: position %d", d.Position)
	case o.Result == ingest.ResultSkipped:
		return nil // skipped whole, never delivered: no sequence, no attempt
	case d.Sequence < 1 || d.Attempt < 1:
		return fmt.Errorf("item without its delivery: sequence %d, attempt %d", d.Sequence, d.Attempt)
	}
	return nil
}

func decodeEpoch(p []byte, in interner) (Entry, error) {
	d := decoder{b: p}
	r := ingest.Record{Kind: ingest.RecordEpoch}
	r.Partition = int32(d.varint())
	r.Epoch = in.get(d.raw(d.uvarint()))
	r.Position = d.varint()
	if err := d.done(); err != nil {
		return Entry{}, err
	}
	if r.Epoch == "" {
		return Entry{}, errors.New("epoch change without an epoch")
	}
	return Entry{Record: r}, nil
}

func decodeLoss(p []byte, in interner) (Entry, error) {
	d := decoder{b: p}
	r := ingest.Record{Kind: ingest.RecordLoss}
	r.Partition = int32(d.varint())
	r.Epoch = in.get(d.raw(d.uvarint()))
	r.From = d.varint()
	r.To = d.varint()
	r.Reason = d.string()
	return Entry{Record: r}, d.done()
}

func decodePrepare(p []byte) (uint64, map[int32]outbox.Checkpoint, error) {
	d := decoder{b: p}
	txn := d.uvarint()
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail(errShort)
	}
	cps := make(map[int32]outbox.Checkpoint, min(n, 1024))
	for i := uint64(0); i < n && d.err == nil; i++ {
		c := outbox.Checkpoint{Partition: int32(d.varint()), Epoch: d.string(), Position: d.varint()}
		cps[c.Partition] = c
	}
	return txn, cps, d.done()
}

func decodeCommit(p []byte) (uint64, error) {
	d := decoder{b: p}
	txn := d.uvarint()
	return txn, d.done()
}

// appendNext appends the frame that ends a part whose run goes on: the
// next part's number and file name.
func appendNext(buf []byte, part int, name string) []byte {
	return appendFrame(buf, kindNext, func(b []byte) []byte {
		b = binary.AppendUvarint(b, uint64(part))
		return appendString(b, name)
	})
}

// appendEnd appends the frame that ends a run: its part's number, the
// last transaction committed (0: none) and the offset the frame starts
// at, eight bytes big-endian, so that a cut into the frame leaves its
// kind to see.
func appendEnd(buf []byte, part int, txn uint64, at int64) []byte {
	return appendFrame(buf, kindEnd, func(b []byte) []byte {
		b = binary.AppendUvarint(b, uint64(part))
		b = binary.AppendUvarint(b, txn)
		return binary.BigEndian.AppendUint64(b, uint64(at))
	})
}

func decodeNext(p []byte) (int, string, error) {
	d := decoder{b: p}
	part := d.uvarint()
	name := d.string()
	if err := d.done(); err != nil {
		return 0, "", err
	}
	if name == "" || part < 2 {
		return 0, "", fmt.Errorf("successor part %d named %q", part, name)
	}
	return int(part), name, nil
}

func decodeEnd(p []byte) (part int, txn uint64, at int64, err error) {
	d := decoder{b: p}
	part = int(d.uvarint())
	txn = d.uvarint()
	raw := d.raw(8)
	if err := d.done(); err != nil {
		return 0, 0, 0, err
	}
	return part, txn, int64(binary.BigEndian.Uint64(raw)), nil
}
