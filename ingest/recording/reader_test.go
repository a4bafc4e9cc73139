package recording

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// written is a recording made by a Writer, and where each transaction's
// frames end in it.
type written struct {
	data []byte
	txns []Txn
	// prepEnd and commitEnd are where each transaction's prepare and
	// commit frames end.
	prepEnd, commitEnd []int64
}

func testHeader() Header {
	return Header{Outboxd: "test", Feed: "ledger", Kind: "file", Source: "/x", Processor: "ledger",
		Run: "r", Part: 1, From: []Checkpoint{{Partition: 0, Epoch: "e1", Position: 0}}}
}

// randomEntries makes a transaction's records: items of every outcome,
// nil and empty keys and values, headers, epoch changes and losses.
func randomEntries(rng *rand.Rand, seq *int64, pos *int64) []Entry {
	n := 1 + rng.IntN(6)
	var es []Entry
	for range n {
		switch rng.IntN(10) {
		case 0:
			*pos = 0
			es = append(es, Entry{Record: ingest.Record{Kind: ingest.RecordEpoch, Partition: int32(rng.IntN(3)), Epoch: fmt.Sprint("e", rng.IntN(5)), Position: *pos}})
			continue
		case 1:
			es = append(es, Entry{Record: ingest.Record{Kind: ingest.RecordLoss, Partition: 1, Epoch: "e2", From: *pos, To: ingest.UnknownPosition, Reason: "truncated"}})
			continue
		}
		*seq++
		*pos += int64(1 + rng.IntN(100))
		d := ingest.Delivery{Feed: "ledger", Partition: int32(rng.IntN(3)), Topic: []string{"", "t"}[rng.IntN(2)], Sequence: *seq,
			Epoch: "e1", Position: *pos, Attempt: 1 + rng.IntN(3)}
		r := ingest.Record{Kind: ingest.RecordItem, Partition: d.Partition, Topic: d.Topic, Epoch: d.Epoch, Position: d.Position}
		switch rng.IntN(3) {
		case 0:
			r.Item.Value = []byte(fmt.Sprintf("acct-%d,%d", rng.IntN(9), rng.IntN(100)))
		case 1:
			r.Item.Key, r.Item.Value = []byte{}, nil
			r.Item.Headers = []outbox.Header{{Key: "h", Value: nil}, {Key: "", Value: []byte{0, 1}}}
		case 2:
			r.Item.Key = bytes.Repeat([]byte{0xff}, rng.IntN(300))
			r.BadReason, r.BadErr = "line-too-long", errors.New("line of 9 bytes")
		}
		o := ingest.Outcome{Result: ingest.Result(1 + rng.IntN(6))}
		if o.Result == ingest.ResultDeadLettered {
			o.Reason, o.Error, o.Attempts = "malformed", "no comma", d.Attempt
		}
		if o.Result == ingest.ResultRequeued {
			o.DeadLetterID = 7
		}
		es = append(es, Entry{Record: r, Delivery: d, Outcome: o})
	}
	return es
}

// writeRecording writes n transactions; about one in five is prepared
// and not committed (its COMMIT failed) before the next.
func writeRecording(t testing.TB, rng *rand.Rand, n int) written {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r.rec")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	var out written
	var seq, pos int64
	for i := 0; i < n; i++ {
		es := randomEntries(rng, &seq, &pos)
		for _, e := range es {
			if e.Record.Kind == ingest.RecordItem {
				w.Item(e.Record, e.Delivery, e.Outcome)
			} else {
				w.Control(e.Record)
			}
		}
		cps := map[int32]outbox.Checkpoint{0: {Partition: 0, Epoch: "e1", Position: pos}}
		off := w.Size()
		if err := w.Prepare(cps); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(5) == 0 {
			continue // the COMMIT failed: the loop tries the records again in a new transaction
		}
		out.prepEnd = append(out.prepEnd, w.Size())
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		out.commitEnd = append(out.commitEnd, w.Size())
		out.txns = append(out.txns, Txn{Number: w.txn, Entries: es, Checkpoints: cps, Offset: off})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out.data = data
	return out
}

// readAll reads every transaction of data and the tail.
func readAll(data []byte) ([]Txn, Tail, error) {
	r, err := NewReader("test", bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, Tail{}, err
	}
	var txns []Txn
	for {
		txn, err := r.Next()
		if errors.Is(err, io.EOF) {
			return txns, r.Tail(), nil
		}
		if err != nil {
			return txns, r.Tail(), err
		}
		txns = append(txns, txn)
	}
}

func sameTxns(t *testing.T, got, want []Txn) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d transactions, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Number != w.Number || g.Offset != w.Offset || !sameCheckpoints(g.Checkpoints, w.Checkpoints) {
			t.Fatalf("transaction %d: number %d offset %d %v, want %d %d %v", i, g.Number, g.Offset, g.Checkpoints, w.Number, w.Offset, w.Checkpoints)
		}
		if len(g.Entries) != len(w.Entries) {
			t.Fatalf("transaction %d: %d entries, want %d", i, len(g.Entries), len(w.Entries))
		}
		for j := range w.Entries {
			sameEntry(t, g.Entries[j], w.Entries[j])
		}
	}
}

func sameEntry(t *testing.T, g, w Entry) {
	t.Helper()
	gb, wb := g.Record.BadErr, w.Record.BadErr
	g.Record.BadErr, w.Record.BadErr = nil, nil
	if (gb == nil) != (wb == nil) || (gb != nil && gb.Error() != wb.Error()) {
		t.Fatalf("bad error %v, want %v", gb, wb)
	}
	if w.Record.Kind != ingest.RecordItem {
		w.Delivery = ingest.Delivery{}
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("entry\n got %+v\nwant %+v", g, w)
	}
}

func TestReader_RoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := writeRecording(t, rng, 200)
	txns, tail, err := readAll(w.data)
	if err != nil {
		t.Fatal(err)
	}
	sameTxns(t, txns, w.txns)
	if tail != (Tail{Offset: int64(len(w.data))}) {
		t.Fatalf("tail %+v, want none at %d", tail, len(w.data))
	}
}

// TestReader_Truncated cuts a recording at every byte of its last
// transactions: the reader returns exactly the transactions whose commit
// frame is whole, reports the rest as the tail, and never fails.
func TestReader_Truncated(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	w := writeRecording(t, rng, 40)
	first := w.commitEnd[len(w.commitEnd)-6]
	for cut := first; cut <= int64(len(w.data)); cut++ {
		txns, tail, err := readAll(w.data[:cut])
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		whole := 0
		for whole < len(w.commitEnd) && w.commitEnd[whole] <= cut {
			whole++
		}
		sameTxns(t, txns, w.txns[:whole])
		end := w.commitEnd[whole-1]
		if whole < len(w.txns) && w.prepEnd[whole] <= cut {
			// Prepared whole, its commit frame cut: unconfirmed.
			if tail.Unconfirmed == nil || tail.Unconfirmed.Number != w.txns[whole].Number {
				t.Fatalf("cut at %d: tail %+v, want transaction %d unconfirmed", cut, tail, w.txns[whole].Number)
			}
			sameTxns(t, []Txn{*tail.Unconfirmed}, w.txns[whole:whole+1])
		} else if tail.Unconfirmed != nil && cut < int64(len(w.data)) {
			// Only an aborted transaction's prepare can be whole here:
			// its number is never one of the committed.
			for _, c := range w.txns {
				if c.Number == tail.Unconfirmed.Number {
					t.Fatalf("cut at %d: committed transaction %d reported unconfirmed", cut, c.Number)
				}
			}
		}
		if tail.Offset < end || tail.Offset+tail.Bytes != cut {
			t.Fatalf("cut at %d: tail %+v, want it from %d or later to the cut", cut, tail, end)
		}
		if cut != end && tail.Bytes == 0 {
			t.Fatalf("cut at %d: no tail reported", cut)
		}
	}
}

// TestReader_Corrupted flips a byte in the middle of a recording: the
// reader returns the transactions before the damage exactly, then an
// error wrapping ErrCorrupt (or ErrBadRecord, when the flip leaves a
// frame whole that the format refuses) — never a wrong record.
func TestReader_Corrupted(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	w := writeRecording(t, rng, 60)
	last := w.commitEnd[len(w.commitEnd)-3]
	start := len(Magic) + 2 + 200 // past the header
	for i := 0; i < 400; i++ {
		at := int64(start + rng.IntN(int(last)-start))
		data := bytes.Clone(w.data)
		data[at] ^= byte(1 + rng.IntN(255))
		txns, _, err := readAll(data)
		if err == nil {
			t.Fatalf("byte %d flipped: read %d transactions and no error", at, len(txns))
		}
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrBadRecord) {
			t.Fatalf("byte %d flipped: %v, want ErrCorrupt", at, err)
		}
		before := 0
		for before < len(w.commitEnd) && w.commitEnd[before] <= at {
			before++
		}
		if len(txns) > before {
			t.Fatalf("byte %d flipped: %d transactions read, only %d end before it", at, len(txns), before)
		}
		sameTxns(t, txns, w.txns[:len(txns)])
	}
}

func TestReader_Refuses(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	w := writeRecording(t, rng, 3)
	t.Run("ErrVersion", func(t *testing.T) {
		data := bytes.Clone(w.data)
		binary.BigEndian.PutUint16(data[len(Magic):], Version+1)
		_, _, err := readAll(data)
		if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "version 3: this outboxd reads version 2") {
			t.Fatalf("err %v, want ErrVersion naming both versions", err)
		}
	})
	t.Run("ErrNotRecording", func(t *testing.T) {
		for _, data := range [][]byte{nil, []byte("alice,10\n"), w.data[:len(Magic)-1]} {
			if _, _, err := readAll(data); !errors.Is(err, ErrNotRecording) {
				t.Fatalf("%q: err %v, want ErrNotRecording", data, err)
			}
		}
	})
	t.Run("HeaderCutShort", func(t *testing.T) {
		if _, _, err := readAll(w.data[:len(Magic)+2+5]); !errors.Is(err, ErrBadRecord) {
			t.Fatalf("err %v, want ErrBadRecord", err)
		}
	})
	t.Run("ItemWithoutDelivery", func(t *testing.T) {
		for name, d := range map[string]ingest.Delivery{
			"no epoch":    {Sequence: 1, Attempt: 1, Position: 5},
			"no sequence": {Epoch: "e", Attempt: 1, Position: 5},
			"no attempt":  {Epoch: "e", Sequence: 1, Position: 5},
		} {
			data := bytes.Clone(w.data)
			data = appendItem(data, ingest.Record{Item: ingest.Item{Value: []byte("alice,1")}}, d, ingest.Outcome{Result: ingest.ResultApplied})
			data = appendPrepare(data, 100, nil)
			data = appendCommit(data, 100)
			txns, _, err := readAll(data)
			if !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), "without its delivery") {
				t.Fatalf("%s: err %v, want ErrBadRecord without its delivery", name, err)
			}
			sameTxns(t, txns, w.txns)
		}
	})
	t.Run("CommitWithoutPrepare", func(t *testing.T) {
		data := appendCommit(bytes.Clone(w.data), 100)
		if _, _, err := readAll(data); !errors.Is(err, ErrBadRecord) {
			t.Fatalf("err %v, want ErrBadRecord", err)
		}
	})
	t.Run("UnknownKind", func(t *testing.T) {
		data := appendFrame(bytes.Clone(w.data), 'Z', func(b []byte) []byte { return append(b, 1, 2, 3) })
		if _, _, err := readAll(data); !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), "unknown record kind") {
			t.Fatalf("err %v, want ErrBadRecord unknown kind", err)
		}
	})
}

// FuzzReader feeds the reader arbitrary bytes after a valid start, and
// damaged copies of a valid recording: it must never panic, never
// allocate past the input's size, and whatever it returns before an
// error must be transactions of the valid recording, in order.
func FuzzReader(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	w := writeRecording(f, rng, 8)
	f.Add(w.data, uint32(0), byte(0))
	f.Add(w.data[:len(w.data)-3], uint32(0), byte(0))
	f.Add(w.data, uint32(len(w.data)/2), byte(0x40))
	f.Add([]byte(Magic+"\x00\x01"), uint32(0), byte(0))
	f.Fuzz(func(t *testing.T, data []byte, at uint32, flip byte) {
		if len(data) > 0 {
			data = bytes.Clone(data)
			data[int(at)%len(data)] ^= flip
		}
		txns, tail, err := readAll(data)
		if err == nil && tail.Offset+tail.Bytes != int64(len(data)) {
			t.Fatalf("tail %+v does not end at %d", tail, len(data))
		}
		if len(data) >= len(w.data) && bytes.Equal(data[:len(w.data)], w.data) && len(txns) < len(w.txns) {
			t.Fatalf("the valid recording is a prefix, yet only %d of its %d transactions were read (%v)", len(txns), len(w.txns), err)
		}
		for _, txn := range txns {
			for _, e := range txn.Entries {
				if e.Record.Kind == ingest.RecordItem {
					if err := checkItem(e); err != nil {
						t.Fatalf("returned an item without its delivery: %v", err)
					}
				}
			}
		}
	})
}

// TestWriter_ItemInTwoSteps: an item begun and ended is the frame Item
// writes; one begun and not ended is dropped (by the next item or the
// transaction's prepare); an epoch change that comes while an item is
// begun is recorded before it.
func TestWriter_ItemInTwoSteps(t *testing.T) {
	item := func(pos int64, v string) (ingest.Record, ingest.Delivery) {
		return ingest.Record{Kind: ingest.RecordItem, Epoch: "e", Position: pos, Item: ingest.Item{Key: []byte("k"), Value: []byte(v)}},
			ingest.Delivery{Feed: "f", Sequence: pos, Epoch: "e", Position: pos, Attempt: 1}
	}
	applied := ingest.Outcome{Result: ingest.ResultApplied, Attempts: 1}
	path := filepath.Join(t.TempDir(), "r.rec")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	r1, d1 := item(1, "one")
	w.BeginItem(r1, d1)
	w.BeginItem(item(2, "dropped: no outcome"))
	r3, d3 := item(3, "three")
	w.BeginItem(r3, d3)
	epoch := ingest.Record{Kind: ingest.RecordEpoch, Epoch: "e2", Position: 0}
	w.Control(epoch)
	if !w.EndItem(applied) || w.EndItem(applied) {
		t.Fatal("EndItem: want true once, then false")
	}
	r4, d4 := item(4, "four")
	w.Item(r4, d4, applied)
	w.BeginItem(item(5, "dropped at prepare"))
	must(t, w.Prepare(map[int32]outbox.Checkpoint{0: {Epoch: "e", Position: 4}}))
	must(t, w.Commit())
	must(t, w.Close())
	data, err := os.ReadFile(path)
	must(t, err)
	txns, _, err := readAll(data)
	must(t, err)
	if len(txns) != 1 {
		t.Fatalf("%d transactions, want 1", len(txns))
	}
	want := []Entry{{Record: epoch}, {Record: r3, Delivery: d3, Outcome: applied}, {Record: r4, Delivery: d4, Outcome: applied}}
	got := txns[0].Entries
	if len(got) != len(want) {
		t.Fatalf("entries %+v, want %+v", got, want)
	}
	for i := range want {
		g, e := got[i], want[i]
		if g.Record.Kind != e.Record.Kind || g.Record.Epoch != e.Record.Epoch || !bytes.Equal(g.Record.Item.Value, e.Record.Item.Value) ||
			g.Delivery.Position != e.Delivery.Position || g.Outcome != e.Outcome {
			t.Fatalf("entry %d: %+v, want %+v", i, g, e)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReader_EndOfRun: a run's last part ends with its end record, after
// which nothing may follow; damage to the last records of a file is
// damage, with its offset, not the tail a crash leaves: a crash cuts
// short the write of a transaction's records, it changes no byte and
// never cuts the end record.
func TestReader_EndOfRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	w := writeRecording(t, rng, 20)
	last := w.txns[len(w.txns)-1]
	ended := appendEnd(bytes.Clone(w.data), 1, last.Number, int64(len(w.data)))
	end := int64(len(w.data))
	txns, tail, err := readAll(ended)
	if err != nil {
		t.Fatal(err)
	}
	sameTxns(t, txns, w.txns)
	if tail != (Tail{Offset: int64(len(ended)), Ended: true, EndOffset: end}) {
		t.Fatalf("tail %+v", tail)
	}
	damaged := func(name string, data []byte, want string) {
		t.Helper()
		txns, _, err := readAll(data)
		if !errors.Is(err, ErrCorrupt) || err.Error() != want {
			t.Fatalf("%s: %v\nwant %s", name, err, want)
		}
		if len(txns) > len(w.txns) {
			t.Fatalf("%s: %d transactions", name, len(txns))
		}
		sameTxns(t, txns, w.txns[:len(txns)])
	}
	commit := w.commitEnd[len(w.commitEnd)-1] - int64(frameHead+1+len(binary.AppendUvarint(nil, last.Number)))
	after := w.commitEnd[len(w.commitEnd)-1] // the end, or a transaction prepared whose COMMIT failed
	// The last commit damaged, whole records after it.
	data := bytes.Clone(ended)
	data[commit+frameHead+1] ^= 0xff
	damaged("commit", data, fmt.Sprintf("recording test: recording damaged: offset %d: a record whose checksum does not match, yet a whole record follows at offset %d", commit, after))
	// A run killed, its last commit the file's last record: damaged too.
	data = bytes.Clone(w.data[:after])
	data[commit+frameHead+1] ^= 0xff
	damaged("commit, no end", data, fmt.Sprintf("recording test: recording damaged: offset %d: a record whose checksum does not match: a crash cuts a record short, it does not change one", commit))
	cutEnd := "recording test: recording damaged: offset %d: a end-of-run record cut short, which is written after the last transaction, whole, by a write of its own: a crash does not cut it"
	for cut := int64(len(ended)) - 1; cut > end; cut-- {
		data := ended[:cut]
		if cut > end+frameHead { // its kind is there to see
			damaged(fmt.Sprintf("cut at %d", cut), data, fmt.Sprintf(cutEnd, end))
			continue
		}
		// The kind cut off too: a tail as a crash could leave, and every
		// transaction read.
		txns, tail, err := readAll(data)
		if err != nil || len(txns) != len(w.txns) || tail.Torn != "a record cut short" || tail.Offset != end {
			t.Fatalf("cut at %d: %d transactions, tail %+v, %v", cut, len(txns), tail, err)
		}
	}
	for at := end; at < int64(len(ended)); at++ {
		data := bytes.Clone(ended)
		data[at] ^= 0x20
		if _, _, err := readAll(data); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d of the end flipped: %v, want ErrCorrupt", at, err)
		}
	}
	more := appendCommit(bytes.Clone(ended), 99)
	if _, _, err := readAll(more); !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), fmt.Sprintf("a record after the end of the part at offset %d", end)) {
		t.Fatalf("a record after the end: %v", err)
	}
}
