package devkafka

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// kfake's data directory, as recovery reads and completes it before kfake
// loads it: partitions/<topic, path-escaped>-<partition>/ holds segments
// <base offset>.dat (RecordBatches as on the wire, one after the other) and
// beside each an index <base offset>.idx of 15-byte entries, one per batch:
// version (1), the low byte of the CRC-32C of the 13 bytes that follow, the
// partition's leader epoch (4 bytes), a timestamp (8; recomputed on load),
// flags (bit 0: the batch is part of a transaction). All little-endian.
const (
	idxEntrySize = 15
	idxVersion   = 1
	// batchHeaderSize is a RecordBatch's fixed part, up to its record count.
	batchHeaderSize = 61
	attrTxn         = 0x10
	attrControl     = 0x20
)

// batchHeader is what recovery reads of one RecordBatch of a segment.
type batchHeader struct {
	firstOffset     int64
	lastOffsetDelta int32
	leaderEpoch     int32
	attrs           int16
	maxTimestamp    int64
	pid             int64
	epoch           int16
}

func (b batchHeader) control() bool { return b.attrs&attrControl != 0 }
func (b batchHeader) inTxn() bool   { return b.attrs&attrTxn != 0 && !b.control() }
func (b batchHeader) end() int64    { return b.firstOffset + int64(b.lastOffsetDelta) + 1 }

// parseSegment reads the whole, undamaged batches at the start of a
// segment's bytes, as kfake's load does: it stops at the first torn or
// damaged one. valid is the length they take.
func parseSegment(raw []byte) (bs []batchHeader, valid int) {
	for pos := 0; pos+batchHeaderSize <= len(raw); {
		size := batchSize(raw[pos:])
		if size < batchHeaderSize || pos+size > len(raw) || !batchCRCOK(raw[pos:pos+size]) {
			break
		}
		bs = append(bs, readHeader(raw[pos:]))
		pos += size
		valid = pos
	}
	return bs, valid
}

// batchSize is the size of the batch whose header starts h.
func batchSize(h []byte) int { return 12 + int(int32(binary.BigEndian.Uint32(h[8:12]))) }

func batchCRCOK(b []byte) bool {
	return crc32.Checksum(b[21:], castagnoli) == binary.BigEndian.Uint32(b[17:21])
}

func readHeader(h []byte) batchHeader {
	return batchHeader{
		firstOffset:     int64(binary.BigEndian.Uint64(h[0:8])),
		leaderEpoch:     int32(binary.BigEndian.Uint32(h[12:16])),
		attrs:           int16(binary.BigEndian.Uint16(h[21:23])),
		lastOffsetDelta: int32(binary.BigEndian.Uint32(h[23:27])),
		maxTimestamp:    int64(binary.BigEndian.Uint64(h[35:43])),
		pid:             int64(binary.BigEndian.Uint64(h[43:51])),
		epoch:           int16(binary.BigEndian.Uint16(h[51:53])),
	}
}

// scanChunk is how much of a segment scanSegment reads at a time.
const scanChunk = 64 << 10

// scanSegment reads the batch headers of the segment file at path, reading
// only around them (a batch larger than what is left of a chunk is
// skipped, not read). A crash can tear only the end of a segment, so only
// the last batch's CRC is checked: a batch cut short, or a last one whose
// CRC fails, ends the valid part, as it would end kfake's load.
func scanSegment(path string) (bs []batchHeader, valid int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := fi.Size()
	buf := make([]byte, scanChunk)
	var chunk []byte // the file's bytes from chunkAt
	var chunkAt, lastAt int64
	lastSize := 0
	for pos := int64(0); pos+batchHeaderSize <= size; {
		if pos < chunkAt || pos+batchHeaderSize > chunkAt+int64(len(chunk)) {
			n, err := f.ReadAt(buf, pos)
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, 0, err
			}
			chunk, chunkAt = buf[:n], pos
		}
		h := chunk[pos-chunkAt:]
		if len(h) < batchHeaderSize {
			break // the file shrank under us
		}
		n := batchSize(h)
		if n < batchHeaderSize || pos+int64(n) > size {
			break
		}
		bs = append(bs, readHeader(h))
		lastAt, lastSize = pos, n
		pos += int64(n)
		valid = pos
	}
	if len(bs) > 0 {
		last := make([]byte, lastSize)
		if _, err := f.ReadAt(last, lastAt); err != nil {
			return nil, 0, err
		}
		if !batchCRCOK(last) {
			bs, valid = bs[:len(bs)-1], lastAt
		}
	}
	return bs, valid, nil
}

// idxEntry encodes a batch's index entry as kfake does.
func idxEntry(b batchHeader) []byte {
	e := make([]byte, idxEntrySize)
	e[0] = idxVersion
	binary.LittleEndian.PutUint32(e[2:6], uint32(b.leaderEpoch))
	binary.LittleEndian.PutUint64(e[6:14], uint64(b.maxTimestamp))
	if b.inTxn() {
		e[14] = 1
	}
	e[1] = byte(crc32.Checksum(e[2:], castagnoli))
	return e
}

// markerBatch is the end marker kfake writes for pid's transaction at
// offset, as its own EndTxn would.
func markerBatch(offset int64, leaderEpoch int32, pid int64, epoch int16, commit bool, now time.Time) []byte {
	key := kmsg.ControlRecordKey{Type: kmsg.ControlRecordKeyTypeAbort}
	if commit {
		key.Type = kmsg.ControlRecordKeyTypeCommit
	}
	marker := kmsg.EndTxnMarker{CoordinatorEpoch: 0}
	rec := kmsg.Record{Key: key.AppendTo(nil), Value: marker.AppendTo(nil)}
	rec.Length = int32(len(rec.AppendTo(nil)) - 1) // the length's own varint takes one byte
	ms := now.UnixMilli()
	b := kmsg.RecordBatch{
		FirstOffset:          offset,
		PartitionLeaderEpoch: leaderEpoch,
		Magic:                2,
		Attributes:           attrControl | attrTxn,
		FirstTimestamp:       ms,
		MaxTimestamp:         ms,
		ProducerID:           pid,
		ProducerEpoch:        epoch,
		FirstSequence:        -1,
		NumRecords:           1,
		Records:              rec.AppendTo(nil),
	}
	enc := b.AppendTo(nil)
	b.Length = int32(len(enc) - 12)
	b.CRC = int32(crc32.Checksum(enc[21:], castagnoli))
	return b.AppendTo(nil)
}

// partitionDirName is kfake's directory name of a partition.
func partitionDirName(topic string, p int32) string {
	return url.PathEscape(topic) + "-" + strconv.Itoa(int(p))
}

// segmentBases lists the base offsets of a partition directory's segments,
// in order.
func segmentBases(pdir string) ([]int64, error) {
	ents, err := os.ReadDir(pdir)
	if err != nil {
		return nil, err
	}
	var bases []int64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".dat")
		if !ok {
			continue
		}
		if base, err := strconv.ParseInt(name, 10, 64); err == nil {
			bases = append(bases, base)
		}
	}
	slices.Sort(bases)
	return bases, nil
}

// recoverTxns makes the data directory dir crash-consistent before kfake
// loads it. In every partition a crash left (one whose snapshot of a clean
// close does not match its segments) it drops a torn batch and completes the
// index (a batch whose entry is lost would load as outside any transaction,
// visible even if its transaction aborts); it writes each end marker the
// newest logged decision still lacks, so that decision holds on all the
// transaction's partitions; and it ends every other transaction still open
// with an abort marker. kfake would abort those in memory only, and a later
// load, finding the producer's next transaction committed after them on
// the same partition, would take them for part of it. Everything it writes
// is synced before it returns.
func recoverTxns(dir string, logger *slog.Logger) error {
	d, ok, err := lastDecision(filepath.Join(dir, decisionsFile))
	if err != nil {
		return err
	}
	marks := map[string]decisionPart{}
	if ok {
		for _, p := range d.Parts {
			marks[partitionDirName(p.Topic, p.Partition)] = p
		}
	}
	ents, err := os.ReadDir(filepath.Join(dir, "partitions"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dev broker recovery: %w", err)
	}
	ended := map[int64]pidEnd{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		var dp *decisionPart
		if p, ok := marks[e.Name()]; ok {
			dp = &p
		}
		if err := recoverPartition(filepath.Join(dir, "partitions", e.Name()), d, dp, ended, logger); err != nil {
			return fmt.Errorf("dev broker recovery of %s: %w", e.Name(), err)
		}
	}
	if err := endProducers(filepath.Join(dir, "pids.log"), ended); err != nil {
		return fmt.Errorf("dev broker recovery: %w", err)
	}
	return nil
}

// pidEnd is how recovery ended a producer's transaction: the epoch the
// producer has from then on, and whether it committed.
type pidEnd struct {
	epoch  int16
	commit bool
}

// recoverPartition repairs the partition in pdir; dp, when set, is where
// the decision d puts its marker there. It notes in ended each producer
// whose transaction it ends.
func recoverPartition(pdir string, d decision, dp *decisionPart, ended map[int64]pidEnd, logger *slog.Logger) error {
	bases, err := segmentBases(pdir)
	if err != nil || cleanlyClosed(pdir, bases) {
		return err
	}
	newest := map[int64]batchHeader{} // each producer's newest batch
	var last batchHeader
	var lastBase int64 = -1
	for _, base := range bases {
		seg, err := repairSegment(pdir, base, logger)
		if err != nil {
			return err
		}
		for _, b := range seg.batches {
			if b.pid >= 0 {
				newest[b.pid] = b
			}
		}
		if n := len(seg.batches); n > 0 {
			last, lastBase = seg.batches[n-1], base
		}
	}
	if lastBase < 0 {
		return nil
	}
	end := last.end()
	if dp != nil {
		b, open := newest[d.PID]
		switch {
		case end < dp.Marker:
			logger.Warn("dev broker: a partition ends before a transaction's logged end",
				"dir", pdir, "end", end, "marker", dp.Marker)
		case end == dp.Marker && open && b.inTxn() && b.epoch == d.Epoch:
			// kfake writes this marker at the partition's end when
			// the decision is logged: nothing came after it.
			if err := appendBatch(pdir, lastBase, markerBatch(end, last.leaderEpoch, d.PID, d.Epoch, d.Commit, time.Now())); err != nil {
				return err
			}
			logger.Info("dev broker: ended a transaction a crash left half-ended", "topic", dp.Topic, "partition", dp.Partition,
				"offset", end, "commit", d.Commit, "producerId", d.PID)
			delete(newest, d.PID)
			end++
			if _, ok := ended[d.PID]; !ok {
				ended[d.PID] = pidEnd{epoch: d.Epoch, commit: d.Commit}
			}
		}
	}
	pids := slices.Sorted(maps.Keys(newest))
	for _, pid := range pids {
		b := newest[pid]
		if !b.inTxn() {
			continue
		}
		if err := appendBatch(pdir, lastBase, markerBatch(end, last.leaderEpoch, pid, b.epoch, false, time.Now())); err != nil {
			return err
		}
		logger.Info("dev broker: aborted a transaction a crash left open", "dir", pdir, "offset", end, "producerId", pid)
		end++
		// The producer is fenced, as kfake fences one whose
		// transaction it aborts: it learns its transaction is gone.
		ended[pid] = pidEnd{epoch: b.epoch + 1}
	}
	return nil
}

// cleanlyClosed says whether the partition's snapshot, which kfake writes
// at a clean close, still matches its segments: nothing was written since,
// and kfake loads it from the snapshot (with any transaction it left open
// still open, to be ended by its producer).
func cleanlyClosed(pdir string, bases []int64) bool {
	raw, err := os.ReadFile(filepath.Join(pdir, "snapshot.json"))
	if err != nil {
		return false
	}
	var snap struct {
		Segments []struct {
			Base int64 `json:"base_offset"`
			Size int64 `json:"size"`
		} `json:"segments"`
	}
	if json.Unmarshal(raw, &snap) != nil || len(snap.Segments) != len(bases) || len(bases) == 0 {
		return false
	}
	for i, s := range snap.Segments {
		fi, err := os.Stat(filepath.Join(pdir, fmt.Sprintf("%d.dat", bases[i])))
		if s.Base != bases[i] || err != nil || fi.Size() != s.Size {
			return false
		}
	}
	return true
}

// endProducers appends to kfake's producer log at path the end of each
// transaction recovery ended, in kfake's framing (length, CRC-32C, version
// 1, then a JSON entry; little-endian), after cutting off a torn entry a
// crash left at its end (kfake would append after it, and lose what it
// appends on the next load).
func endProducers(path string, ended map[int64]pidEnd) error {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	valid := 0
	for valid+10 <= len(raw) {
		n := int(binary.LittleEndian.Uint32(raw[valid : valid+4]))
		if n < 2 || valid+8+n > len(raw) ||
			crc32.Checksum(raw[valid+8:valid+8+n], castagnoli) != binary.LittleEndian.Uint32(raw[valid+4:valid+8]) {
			break
		}
		valid += 8 + n
	}
	if valid < len(raw) {
		if err := truncateSync(path, int64(valid)); err != nil {
			return err
		}
	}
	var add []byte
	for _, pid := range slices.Sorted(maps.Keys(ended)) {
		e := ended[pid]
		js, err := json.Marshal(struct {
			Type   string `json:"type"`
			PID    int64  `json:"pid"`
			Epoch  int16  `json:"epoch"`
			Commit bool   `json:"commit"`
		}{"endtx", pid, e.epoch, e.commit})
		if err != nil {
			return err
		}
		body := binary.LittleEndian.AppendUint16(nil, 1)
		body = append(body, js...)
		add = binary.LittleEndian.AppendUint32(add, uint32(len(body)))
		add = binary.LittleEndian.AppendUint32(add, crc32.Checksum(body, castagnoli))
		add = append(add, body...)
	}
	if len(add) == 0 {
		return nil
	}
	return appendSync(path, add)
}

// segment is a partition's segment as recovery read it.
type segment struct {
	base    int64
	batches []batchHeader
}

// repairSegment reads segment base of pdir, cuts a torn or damaged tail off
// it, and makes its index hold one entry per batch.
func repairSegment(pdir string, base int64, logger *slog.Logger) (segment, error) {
	datPath := filepath.Join(pdir, fmt.Sprintf("%d.dat", base))
	idxPath := filepath.Join(pdir, fmt.Sprintf("%d.idx", base))
	fi, err := os.Stat(datPath)
	if err != nil {
		return segment{}, err
	}
	bs, valid, err := scanSegment(datPath)
	if err != nil {
		return segment{}, err
	}
	seg := segment{base: base, batches: bs}
	if valid < fi.Size() {
		logger.Info("dev broker: dropping a torn batch a crash left", "segment", datPath, "bytes", fi.Size()-valid)
		if err := truncateSync(datPath, valid); err != nil {
			return seg, err
		}
	}
	idx, err := os.ReadFile(idxPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return seg, err
	}
	have := len(idx) / idxEntrySize
	for i := 0; i < have; i++ {
		if idx[i*idxEntrySize] != idxVersion {
			return seg, fmt.Errorf("%s: index entry version %d, recovery knows %d", idxPath, idx[i*idxEntrySize], idxVersion)
		}
	}
	switch {
	case len(idx) > len(bs)*idxEntrySize:
		return seg, truncateSync(idxPath, int64(len(bs)*idxEntrySize))
	case have < len(bs):
		if len(idx) != have*idxEntrySize {
			if err := truncateSync(idxPath, int64(have*idxEntrySize)); err != nil {
				return seg, err
			}
		}
		var add []byte
		for _, b := range bs[have:] {
			add = append(add, idxEntry(b)...)
		}
		logger.Info("dev broker: completing an index a crash left short", "index", idxPath, "entries", len(bs)-have)
		return seg, appendSync(idxPath, add)
	}
	return seg, nil
}

// appendBatch appends the batch to segment base of pdir and its entry to the
// segment's index.
func appendBatch(pdir string, base int64, batch []byte) error {
	bs, _ := parseSegment(batch)
	if len(bs) != 1 {
		return errors.New("encode end marker: not one batch")
	}
	if err := appendSync(filepath.Join(pdir, fmt.Sprintf("%d.dat", base)), batch); err != nil {
		return err
	}
	return appendSync(filepath.Join(pdir, fmt.Sprintf("%d.idx", base)), idxEntry(bs[0]))
}

func appendSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func truncateSync(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
