package kafkafeed

import (
	"testing"

	"github.com/IBM/sarama"
)

// testBlock is a fetched partition: an aborted transaction's batch
// (offsets 0-1, producer 7), its abort marker (2), a committed batch (3-4),
// and, with cut, a cut batch after them.
func testBlock(lso int64, cut bool) *sarama.FetchResponseBlock {
	rec := func(delta int64, v string) *sarama.Record {
		return &sarama.Record{OffsetDelta: delta, Value: []byte(v)}
	}
	batches := []*sarama.RecordBatch{
		{FirstOffset: 0, LastOffsetDelta: 1, ProducerID: 7, IsTransactional: true, Records: []*sarama.Record{rec(0, "a0"), rec(1, "a1")}},
		{FirstOffset: 2, LastOffsetDelta: 0, ProducerID: 7, IsTransactional: true, Control: true,
			Records: []*sarama.Record{{Key: []byte{0, 0, 0, 0}}}},
		{FirstOffset: 3, LastOffsetDelta: 1, Records: []*sarama.Record{rec(0, "c3"), rec(1, "c4")}},
	}
	if cut {
		batches = append(batches, &sarama.RecordBatch{FirstOffset: 5, LastOffsetDelta: 3, PartialTrailingRecord: true})
	}
	b := &sarama.FetchResponseBlock{LastStableOffset: lso,
		AbortedTransactions: []*sarama.AbortedTransaction{{ProducerID: 7, FirstOffset: 0}}}
	for _, batch := range batches {
		b.RecordsSet = append(b.RecordsSet, &sarama.Records{RecordBatch: batch})
	}
	return b
}

func TestCollectCommitted(t *testing.T) {
	for _, tc := range []struct {
		from, end int64
		want      map[int64]string
	}{
		{0, 5, map[int64]string{3: "c3", 4: "c4"}},
		{4, 5, map[int64]string{4: "c4"}},
		{9, 9, map[int64]string{}},
	} {
		out := map[int64]fetched{}
		end := collectCommitted(testBlock(9, true), tc.from, out)
		got := map[int64]string{}
		for off, f := range out {
			got[off] = string(f.value)
		}
		if end != tc.end || len(got) != len(tc.want) {
			t.Fatalf("collectCommitted(from %d) = %d, %v; want %d, %v", tc.from, end, got, tc.end, tc.want)
		}
		for off, v := range tc.want {
			if got[off] != v {
				t.Fatalf("collectCommitted(from %d)[%d] = %q, want %q", tc.from, off, got[off], v)
			}
		}
	}
}

func TestScanTail(t *testing.T) {
	onlyAborted := func(lso int64, cut bool) *sarama.FetchResponseBlock {
		b := testBlock(lso, cut)
		b.RecordsSet = append(b.RecordsSet[:2], b.RecordsSet[3:]...)
		return b
	}
	for _, tc := range []struct {
		name              string
		block             *sarama.FetchResponseBlock
		next              int64
		readable, covered bool
	}{
		{"Committed", testBlock(5, false), 0, true, true},
		{"CommittedBehindNext", testBlock(5, false), 5, false, true},
		{"AbortedToTheLSO", onlyAborted(3, false), 0, false, true},
		{"AbortedShortOfTheLSO", onlyAborted(5, false), 0, false, false},
		{"AbortedThenCut", onlyAborted(9, true), 0, true, false},
	} {
		readable, covered := scanTail(tc.block, tc.next)
		if readable != tc.readable || covered != tc.covered {
			t.Errorf("%s: scanTail = %v, %v; want %v, %v", tc.name, readable, covered, tc.readable, tc.covered)
		}
	}
}
