package recording_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkRecorder is what recording adds to the ingest loop per item:
// a ledger line handed over, its outcome, and its share of a batch of
// 4000's prepare and commit frames and write.
func BenchmarkRecorder(b *testing.B) {
	rec, err := recording.NewRecorder(recording.Options{Logger: quiet, Dir: b.TempDir(), MaxBytes: recording.DefaultMaxBytes,
		Header: recording.Header{Feed: "bench", Kind: ingest.KindFile, Source: "/in.csv", Processor: "ledger"}})
	if err != nil {
		b.Fatal(err)
	}
	cps := map[int32]outbox.Checkpoint{0: {Epoch: "65024:9979361:7d453c7ecb0cbfce"}}
	rec.Start(context.Background(), cps)
	defer rec.Close()
	const batch = 4000
	lines := make([][]byte, batch)
	for i := range lines {
		lines[i] = fmt.Appendf(nil, "acct-%d,%d", i%1000, i-2000)
	}
	b.ReportAllocs()
	b.ResetTimer()
	pos := int64(0)
	for i := range b.N {
		if i%batch == 0 {
			rec.Begin()
		}
		v := lines[i%batch]
		pos += int64(len(v)) + 1
		r := ingest.Record{Kind: ingest.RecordItem, Epoch: cps[0].Epoch, Position: pos, Item: ingest.Item{Value: v}}
		rec.Handled(r, ingest.Delivery{Feed: "bench", Sequence: int64(i + 1), Epoch: r.Epoch, Position: pos, Attempt: 1})
		rec.Outcome(ingest.Outcome{Result: ingest.ResultApplied, Attempts: 1})
		if i%batch == batch-1 {
			cps[0] = outbox.Checkpoint{Epoch: cps[0].Epoch, Position: pos}
			rec.Prepare(cps)
			rec.Committed()
		}
	}
	b.StopTimer()
	if st := rec.Status(); st.Error != "" {
		b.Fatal(st.Error)
	}
}
