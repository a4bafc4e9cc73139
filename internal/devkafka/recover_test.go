package devkafka

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The partitions every test transaction writes to: three of "out" and the
// one of "progress", as the relay's transactions do.
var txnParts = []topicPartition{{"out", 0}, {"out", 1}, {"out", 2}, {"progress", 0}}

// txnBroker is a dev broker with a data directory and a transactional
// producer writing to txnParts.
type txnBroker struct {
	b   *Broker
	cl  *kgo.Client
	dir string
}

func startTxnBroker(t *testing.T) *txnBroker {
	t.Helper()
	return startTxnBrokerOn(t, t.TempDir(), true)
}

// startTxnBrokerOn starts the broker on dir, creating the topics when told.
func startTxnBrokerOn(t *testing.T, dir string, create bool) *txnBroker {
	t.Helper()
	b, err := StartWith(Options{Addr: "127.0.0.1:0", DataDir: dir, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.TransactionalID("relay"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for topic, n := range map[string]int32{"out": 3, "progress": 1} {
		if !create {
			break
		}
		if err := b.c.CreateTopic(topic, n, nil); err != nil {
			t.Fatal(err)
		}
	}
	return &txnBroker{b: b, cl: cl, dir: dir}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// begin opens a transaction and writes the value tag to every partition.
func (tb *txnBroker) begin(t *testing.T, tag string) {
	t.Helper()
	if err := tb.cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, tp := range txnParts {
		r := &kgo.Record{Topic: tp.topic, Partition: tp.partition, Value: []byte(tag)}
		if err := tb.cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// txn writes tag to every partition in one transaction, committed or not.
func (tb *txnBroker) txn(t *testing.T, tag string, commit bool) {
	t.Helper()
	tb.begin(t, tag)
	if err := tb.cl.EndTransaction(context.Background(), kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

// crashCopy copies the data directory as a kill -9 leaves it (every write
// is synced, nothing of a clean close is in it) and takes away the last
// batch of each of drop's partitions: the markers a crash did not let
// kfake write.
func (tb *txnBroker) crashCopy(t *testing.T, drop ...topicPartition) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(tb.dir)); err != nil {
		t.Fatal(err)
	}
	for _, tp := range drop {
		pdir := filepath.Join(dst, "partitions", partitionDirName(tp.topic, tp.partition))
		bases, err := segmentBases(pdir)
		if err != nil || len(bases) == 0 {
			t.Fatalf("%s: segments %v (%v)", pdir, bases, err)
		}
		dat := filepath.Join(pdir, fmt.Sprintf("%d.dat", bases[len(bases)-1]))
		raw, err := os.ReadFile(dat)
		if err != nil {
			t.Fatal(err)
		}
		bs, _ := parseSegment(raw)
		if last := bs[len(bs)-1]; !last.control() {
			t.Fatalf("%s ends in a batch that is no marker: %+v", dat, last)
		}
		if err := os.Truncate(dat, lastBatchStart(raw)); err != nil {
			t.Fatal(err)
		}
		idx := strings.TrimSuffix(dat, ".dat") + ".idx"
		if err := os.Truncate(idx, int64((len(bs)-1)*idxEntrySize)); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// lastBatchStart is where a segment's last batch begins.
func lastBatchStart(raw []byte) int64 {
	var pos, last int
	for pos < len(raw) {
		last = pos
		pos += 12 + int(binary.BigEndian.Uint32(raw[pos+8:pos+12]))
	}
	return int64(last)
}

// committed starts a broker on dir and reads every partition of txnParts
// read_committed up to a sentinel it appends: the values seen, per partition.
func committed(t *testing.T, dir string) map[topicPartition][]string {
	t.Helper()
	b, err := StartWith(Options{Addr: "127.0.0.1:0", DataDir: dir, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	sentinel := fmt.Sprintf("end %d", time.Now().UnixNano())
	for _, tp := range txnParts {
		if err := pr.ProduceSync(ctx, &kgo.Record{Topic: tp.topic, Partition: tp.partition, Value: []byte(sentinel)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ConsumeTopics("out", "progress"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[topicPartition][]string{}
	for open := len(txnParts); open > 0; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read committed: %d partitions not read to their end: %v (read %v)", open, ctx.Err(), got)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if v := string(r.Value); v == sentinel {
				open--
				return
			} else if strings.HasPrefix(v, "end ") {
				return // an earlier reader's
			}
			tp := topicPartition{r.Topic, r.Partition}
			got[tp] = append(got[tp], string(r.Value))
		})
	}
	return got
}

// wantEverywhere checks every partition of txnParts holds exactly tags.
func wantEverywhere(t *testing.T, got map[topicPartition][]string, tags ...string) {
	t.Helper()
	for _, tp := range txnParts {
		if !slices.Equal(got[tp], tags) {
			t.Errorf("%s[%d] holds %q, want %q (all: %v)", tp.topic, tp.partition, got[tp], tags, got)
		}
	}
}

// TestRecoverTxns: after a crash, a transaction ends the same way on every
// partition it wrote to: committed when its commit was logged, whatever
// markers the crash let kfake write, and aborted when nothing was logged.
func TestRecoverTxns(t *testing.T) {
	progress := topicPartition{"progress", 0}
	t.Run("CommitHalfWritten", func(t *testing.T) {
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.txn(t, "t2", true)
		wantEverywhere(t, committed(t, tb.crashCopy(t, txnParts[1], progress)), "t1", "t2")
	})
	t.Run("CommitNoMarkerWritten", func(t *testing.T) {
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.txn(t, "t2", true)
		wantEverywhere(t, committed(t, tb.crashCopy(t, txnParts...)), "t1", "t2")
	})
	t.Run("AbortHalfWritten", func(t *testing.T) {
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.txn(t, "t2", false)
		wantEverywhere(t, committed(t, tb.crashCopy(t, txnParts[0], progress)), "t1")
	})
	t.Run("OpenAfterACommit", func(t *testing.T) {
		// The newest decision is t1's commit: t2, written after it and
		// never ended, is aborted all the same.
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.begin(t, "t2")
		wantEverywhere(t, committed(t, tb.crashCopy(t)), "t1")
	})
	t.Run("OpenThenCommittedAfter", func(t *testing.T) {
		// t2 is open at the crash; after the restart the same producer
		// commits t3 on the same partitions: t2 stays aborted.
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.begin(t, "t2")
		again := startTxnBrokerOn(t, tb.crashCopy(t), false)
		again.txn(t, "t3", true)
		wantEverywhere(t, committed(t, again.crashCopy(t)), "t1", "t3")
	})
	t.Run("IndexEntryLost", func(t *testing.T) {
		// The crash came between t2's batch and its index entry:
		// without the entry kfake would take the batch for one outside
		// any transaction, visible though t2 never committed.
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.begin(t, "t2")
		dir := tb.crashCopy(t)
		idx := filepath.Join(dir, "partitions", partitionDirName("out", 0), "0.idx")
		fi, err := os.Stat(idx)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(idx, fi.Size()-idxEntrySize); err != nil {
			t.Fatal(err)
		}
		wantEverywhere(t, committed(t, dir), "t1")
	})
	t.Run("TornBatch", func(t *testing.T) {
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.txn(t, "t2", true)
		dir := tb.crashCopy(t)
		dat := filepath.Join(dir, "partitions", partitionDirName("progress", 0), "0.dat")
		raw, err := os.ReadFile(dat)
		if err != nil {
			t.Fatal(err)
		}
		whole := len(raw)
		// A batch cut short, then (another run) one whole but damaged.
		n := batchSize(raw) // the first batch's size
		damaged := slices.Clone(raw[:n])
		damaged[n-1] ^= 0xff
		for _, tail := range [][]byte{raw[:n-1], damaged} {
			if err := os.WriteFile(dat, append(raw[:whole:whole], tail...), 0o644); err != nil {
				t.Fatal(err)
			}
			wantEverywhere(t, committed(t, dir), "t1", "t2")
			fi, err := os.Stat(dat)
			if err != nil || fi.Size() < int64(whole) {
				t.Fatalf("segment of %d bytes after recovery (%v), %d before the tear", fi.Size(), err, whole)
			}
			raw, _ = os.ReadFile(dat)
			whole = len(raw)
		}
	})
	t.Run("RecoveredTwice", func(t *testing.T) {
		tb := startTxnBroker(t)
		tb.txn(t, "t1", true)
		tb.txn(t, "t2", true)
		dir := tb.crashCopy(t, progress)
		wantEverywhere(t, committed(t, dir), "t1", "t2")
		got := committed(t, dir) // its own end sentinels are in it now
		for _, tp := range txnParts {
			if !slices.Equal(got[tp], []string{"t1", "t2"}) {
				t.Errorf("second start: %s[%d] holds %q", tp.topic, tp.partition, got[tp])
			}
		}
	})
}

// TestTxnLog_StartsOver: past its bound the decisions log starts over, and
// its newest decision is still the one recovery finds.
func TestTxnLog_StartsOver(t *testing.T) {
	defer func(n int64) { decisionsLogMax = n }(decisionsLogMax)
	decisionsLogMax = 600
	tb := startTxnBroker(t)
	for i := range 10 {
		tb.txn(t, fmt.Sprint("t", i), true)
	}
	path := filepath.Join(tb.dir, decisionsFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Size() > 2*decisionsLogMax {
		t.Fatalf("decisions log of %d bytes (%v), bound %d", fi.Size(), err, decisionsLogMax)
	}
	d, ok, err := lastDecision(path)
	if err != nil || !ok || !d.Commit || d.TxnID != "relay" || len(d.Parts) != len(txnParts) {
		t.Fatalf("newest decision %+v, %v, %v", d, ok, err)
	}
	for _, p := range d.Parts {
		if pi := tb.b.c.PartitionInfo(p.Topic, p.Partition); pi == nil || pi.HighWatermark != p.Marker+1 {
			t.Errorf("%s[%d]: marker at %d, end %+v", p.Topic, p.Partition, p.Marker, pi)
		}
	}
	wantEverywhere(t, committed(t, tb.crashCopy(t, txnParts...)), "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9")
}
