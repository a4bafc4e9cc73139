package devkafka

import (
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// BenchmarkRecoverTxns measures the recovery of a data directory a crash
// left, against the size of its log: four partitions of committed
// transactions (batches of 100 records of 100 bytes, or of one record,
// each followed by its marker), the last transaction of each still open. "recover" is the
// recovery alone (it reads every segment; the first pass writes the abort
// markers, the later ones find nothing to do); "start" is a whole start of
// the broker on the directory, kfake's own load included.
func BenchmarkRecoverTxns(b *testing.B) {
	for _, c := range []struct{ mib, records int }{{1, 100}, {16, 100}, {64, 100}, {256, 100}, {64, 1}} {
		mib := c.mib
		dir := b.TempDir()
		writeCrashedLog(b, dir, 4, int64(mib)<<20/4, c.records)
		b.Run(fmt.Sprintf("recover/%dMiB/records=%d", mib, c.records), func(b *testing.B) {
			b.SetBytes(int64(mib) << 20)
			for b.Loop() {
				if err := recoverTxns(dir, quietLogger()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("start/%dMiB/records=%d", mib, c.records), func(b *testing.B) {
			b.SetBytes(int64(mib) << 20)
			for b.Loop() {
				br, err := StartWith(Options{Addr: "127.0.0.1:0", DataDir: dir, Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				br.Close()
				// A clean close writes snapshots: take them away, as a
				// crash would have, so each start recovers again.
				for p := range 4 {
					os.Remove(filepath.Join(dir, "partitions", partitionDirName("bench", int32(p)), "snapshot.json"))
				}
				b.StartTimer()
			}
		})
	}
}

// writeCrashedLog writes, as kfake would, a topic "bench" of parts
// partitions of about size bytes each, in batches of records records.
func writeCrashedLog(b *testing.B, dir string, parts int, size int64, records int) {
	b.Helper()
	br, err := StartWith(Options{Addr: "127.0.0.1:0", DataDir: dir, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	if err := br.c.CreateTopic("bench", int32(parts), nil); err != nil {
		b.Fatal(err)
	}
	br.Close()
	const pid, epoch = 7, 0
	now := time.Now()
	for p := range parts {
		pdir := filepath.Join(dir, "partitions", partitionDirName("bench", int32(p)))
		if err := os.MkdirAll(pdir, 0o755); err != nil {
			b.Fatal(err)
		}
		var dat, idx []byte
		var off int64
		add := func(batch []byte) {
			bs, _ := parseSegment(batch)
			dat = append(dat, batch...)
			idx = append(idx, idxEntry(bs[0])...)
			off = bs[0].end()
		}
		for int64(len(dat)) < size {
			add(dataBatch(off, pid, epoch, records, 100, now))
			if int64(len(dat)) < size {
				add(markerBatch(off, 0, pid, epoch, true, now))
			}
		}
		if err := os.WriteFile(filepath.Join(pdir, "0.dat"), dat, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pdir, "0.idx"), idx, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Remove(filepath.Join(pdir, "snapshot.json")); err != nil && !os.IsNotExist(err) {
			b.Fatal(err)
		}
	}
}

// dataBatch is a transactional batch of n records of size bytes at offset.
func dataBatch(offset, pid int64, epoch int16, n, size int, now time.Time) []byte {
	var recs []byte
	val := make([]byte, size)
	for i := range n {
		r := kmsg.Record{OffsetDelta: int32(i), Value: val}
		enc := r.AppendTo(nil)
		r.Length = int32(len(enc) - 1)
		recs = r.AppendTo(recs)
	}
	ms := now.UnixMilli()
	batch := kmsg.RecordBatch{FirstOffset: offset, Magic: 2, Attributes: attrTxn, LastOffsetDelta: int32(n - 1),
		FirstTimestamp: ms, MaxTimestamp: ms, ProducerID: pid, ProducerEpoch: epoch, NumRecords: int32(n), Records: recs}
	enc := batch.AppendTo(nil)
	batch.Length = int32(len(enc) - 12)
	batch.CRC = int32(crc32.Checksum(enc[21:], castagnoli))
	return batch.AppendTo(nil)
}
