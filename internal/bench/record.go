package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/outbox"
)

// replayResult is the replay of the ingest_recorded phase's recording,
// and its comparison with that phase's database.
type replayResult struct {
	phaseResult
	// RecordingBytes is the recording's size, BytesPerItem per line.
	RecordingBytes int64   `json:"recording_bytes"`
	BytesPerItem   float64 `json:"bytes_per_item"`
	// Identical says the replay's outputs and balances are those of the
	// recorded run, byte for byte; Deliveries and Outputs were compared,
	// in DiffSeconds.
	Identical   bool    `json:"identical"`
	Deliveries  int64   `json:"deliveries"`
	Outputs     int64   `json:"outputs"`
	DiffSeconds float64 `json:"diff_seconds"`
}

// runIngestRecorded is the ingest phase with the feed recorded (with its
// snapshot), on a database of its own.
func (b *bench) runIngestRecorded(ctx context.Context) error {
	if !b.o.Record {
		return nil
	}
	e, err := b.openEngine(ctx, "recorded")
	if err != nil {
		return err
	}
	defer e.close()
	rec, err := b.newRecorder(e.store)
	if err != nil {
		return err
	}
	start, cpu := time.Now(), startCPU()
	loop, err := e.startLoopRecorded(ctx, b.data.Path, b.topic("recorded"), rec)
	if err != nil {
		return err
	}
	err = e.waitIngested(ctx, b.data.Size)
	elapsed, used := time.Since(start), cpu.used()
	if serr := loop.stop(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	if s := rec.Status(); s.Error != "" {
		return fmt.Errorf("recording: %s", s.Error)
	}
	b.res.IngestRecorded = newPhaseResult(b.data.Lines, elapsed)
	b.res.IngestRecorded.setCPU(used)
	return b.checkOutbox(ctx, e)
}

func (b *bench) newRecorder(s *outbox.Store) (*recording.Recorder, error) {
	o := b.o
	cfg := ingest.DefaultConfig(benchFeed)
	return recording.NewRecorder(recording.Options{
		Dir: b.path("recording"), Store: s, Snapshot: true, MaxBytes: recording.DefaultMaxBytes, Logger: b.log,
		Header: recording.Header{
			Outboxd: "bench", Feed: benchFeed, Kind: ingest.KindFile, Source: b.data.Path, Processor: ledger.Name,
			ProcessorConfig: map[string]string{"topic": b.topic("recorded")},
			Loop: recording.LoopSettings{BatchMax: o.BatchMax, BatchBytes: cfg.BatchBytes, RetryAttempts: cfg.Retry.Attempts,
				AttemptTimeout: cfg.Retry.AttemptTimeout.String(), OnFailure: cfg.OnFailure, OnCompletionFailure: cfg.OnCompletionFailure,
				MaxMessageBytes: cfg.MaxMessageBytes, DeadLetterTopic: b.topic("dlq")},
		},
	})
}

// runReplay replays the ingest_recorded phase's recording from its
// snapshot, then compares the result with that phase's database.
func (b *bench) runReplay(ctx context.Context) error {
	if !b.o.Record {
		return nil
	}
	set, err := recording.Scan([]string{b.path("recording")})
	if err != nil {
		return err
	}
	store, _, err := recording.OpenTarget(ctx, set, b.path("replay.db"), "")
	if err != nil {
		return err
	}
	defer store.Close()
	sum, err := recording.Replay(ctx, recording.ReplayConfig{Set: set, Store: store,
		Processor: ledger.New(b.topic("recorded")), ProcessorName: ledger.Name, Logger: b.log, KeepPlaces: true})
	if err != nil {
		return err
	}
	res := &replayResult{phaseResult: *newPhaseResult(sum.Items, time.Duration(sum.Seconds*float64(time.Second)))}
	for _, f := range set.Files {
		if fi, err := os.Stat(f.Path); err == nil {
			res.RecordingBytes += fi.Size()
		}
	}
	if sum.Items > 0 {
		res.BytesPerItem = round1(float64(res.RecordingBytes) / float64(sum.Items))
	}
	b.res.Replay = res
	return b.compareReplay(ctx, store, sum, res)
}

// compareReplay diffs the replay against the recorded run's database.
func (b *bench) compareReplay(ctx context.Context, store *outbox.Store, sum recording.Summary, res *replayResult) error {
	live, err := outbox.OpenExisting(ctx, b.path("recorded.db"))
	if err != nil {
		return err
	}
	defer live.Close()
	start := time.Now()
	d, err := recording.Diff(ctx, store, live, benchFeed, sum.Places)
	if err != nil {
		return err
	}
	res.DiffSeconds = round3(time.Since(start).Seconds())
	res.Identical, res.Deliveries, res.Outputs = d.Identical, d.Deliveries, d.OutputsReplayed
	switch {
	case !d.Identical:
		b.res.Verify.fail("the replay of the recording diverged: %d of %d deliveries, %d tables", d.Divergent, d.Deliveries, d.DivergentTables)
	case sum.Items != b.data.Lines || d.OutputsDatabase != b.data.Lines:
		b.res.Verify.fail("the replay covered %d items and %d outputs, for %d lines", sum.Items, d.OutputsDatabase, b.data.Lines)
	}
	return nil
}

// cpuClock measures the process's CPU time from its start.
type cpuClock struct{ at time.Duration }

func startCPU() cpuClock { return cpuClock{at: processCPU()} }

// used is the CPU time since the start.
func (c cpuClock) used() time.Duration { return processCPU() - c.at }

// setCPU records the CPU time the phase used, per item.
func (p *phaseResult) setCPU(d time.Duration) {
	if p.Count > 0 && d > 0 {
		p.CPUMicrosPerItem = math.Round(float64(d.Microseconds())/float64(p.Count)*100) / 100
	}
}

// recordLines writes the recording's lines of the table.
func (r *benchResult) recordLines(w io.Writer) {
	if in, rec := r.Ingest, r.IngestRecorded; in != nil && rec != nil {
		fmt.Fprintf(w, "cpu       ingest %.2f us/line, ingest_recorded %.2f us/line (%+.1f%%)\n",
			in.CPUMicrosPerItem, rec.CPUMicrosPerItem, 100*(rec.CPUMicrosPerItem/in.CPUMicrosPerItem-1))
	}
	if p := r.Replay; p != nil {
		verdict := "IDENTICAL outputs and balances"
		if !p.Identical {
			verdict = "DIVERGENT"
		}
		fmt.Fprintf(w, "replay    %d items in %.3fs, %.0f items/s, from a recording of %d bytes (%.1f per item); %s (%d deliveries, %d outputs, diff %.3fs)\n",
			p.Count, p.Seconds, p.PerSecond, p.RecordingBytes, p.BytesPerItem, verdict, p.Deliveries, p.Outputs, p.DiffSeconds)
	}
	if r.IngestRecorded != nil || r.Replay != nil {
		fmt.Fprintln(w)
	}
}
