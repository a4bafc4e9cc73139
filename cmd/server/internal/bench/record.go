package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/outboxd/outboxd/ingest/recording"
)

// The files of the --record phases, in the run's directory.
const (
	recordedDB   = "recorded.db" // ingest_recorded's database
	recordingDir = "recording"   // its recordings and snapshot
	replayDB     = "replay.db"   // the replay's database
)

// recordingResult is what the ingest_recorded phase's server recorded.
type recordingResult struct {
	// Files and Bytes count its recording files (*.rec) and their bytes,
	// BytesPerItem per line; SnapshotBytes is its snapshot's size.
	Files         int     `json:"files"`
	Bytes         int64   `json:"bytes"`
	BytesPerItem  float64 `json:"bytes_per_item"`
	SnapshotBytes int64   `json:"snapshot_bytes"`
}

// replayResult is `server replay --json --diff` of that recording against
// the recorded run's database. Count, Seconds and PerSecond are the
// replay's own (the loop over the recorded deliveries, as the command
// measures it); CPU and PeakRSSMiB are the whole command's (restoring the
// snapshot, replaying, diffing), CommandSeconds its wall time.
type replayResult struct {
	phaseResult
	CommandSeconds     float64 `json:"command_seconds"`
	Applied            int64   `json:"applied"`
	DeadLettered       int64   `json:"dead_lettered"`
	ReplaysSkipped     int64   `json:"replays_skipped"`
	Outputs            int64   `json:"outputs"`
	DecisionsDiffering int64   `json:"decisions_differing"`
	TornTails          int     `json:"torn_tails"`
	Unconfirmed        int     `json:"unconfirmed"`
	// Verdict is the command's: identical or divergent. Identical says
	// the outputs (by place: topic, key, value, headers) and the state
	// tables are the recorded run's, byte for byte; Deliveries,
	// OutputsCompared and RowsCompared say how much was compared.
	Verdict         string `json:"verdict"`
	Identical       bool   `json:"identical"`
	Deliveries      int64  `json:"deliveries"`
	OutputsCompared int64  `json:"outputs_compared"`
	TablesCompared  int    `json:"tables_compared"`
	RowsCompared    int64  `json:"rows_compared"`
}

// runIngestRecorded is the ingest phase with the feed recorded (--record,
// with its snapshot), on a database of its own, right after plain ingest
// so that both see the machine alike.
func (b *bench) runIngestRecorded(ctx context.Context) error {
	s := b.ingestSpec(b.path(recordedDB), b.data)
	s.extra = []string{"--record", b.path(recordingDir)}
	settleDisk()
	res, err := b.ingestFile(ctx, "ingest_recorded", s, b.data)
	if err != nil {
		return err
	}
	b.res.IngestRecorded = res
	rec, err := measureRecording(b.path(recordingDir), b.data.Lines)
	if err != nil {
		return err
	}
	b.res.Recording = rec
	return nil
}

// measureRecording sizes the recordings and snapshot in dir.
func measureRecording(dir string, lines int64) (*recordingResult, error) {
	r := &recordingResult{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the recording: %w", err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("read the recording: %w", err)
		}
		switch filepath.Ext(e.Name()) {
		case ".rec":
			r.Files++
			r.Bytes += fi.Size()
		case ".db":
			r.SnapshotBytes += fi.Size()
		}
	}
	if r.Files == 0 {
		return nil, fmt.Errorf("the server wrote no recording into %s", dir)
	}
	if lines > 0 {
		r.BytesPerItem = round1(float64(r.Bytes) / float64(lines))
	}
	return r, nil
}

// replayReport is the part of `server replay --json` the bench reads.
type replayReport struct {
	Verdict string                `json:"verdict"`
	Replay  recording.Summary     `json:"replay"`
	Diff    *recording.DiffResult `json:"diff"`
}

// runReplayRecording replays the ingest_recorded phase's recording from its
// snapshot with `server replay` (this binary, in a child process) and
// diffs the result against that phase's database.
func (b *bench) runReplayRecording(ctx context.Context) error {
	args := []string{"replay", b.path(recordingDir), "--db", b.path(replayDB), "--diff", b.path(recordedDB), "--json"}
	out, run, err := b.runChild(ctx, args)
	if err != nil {
		return err
	}
	var rep replayReport
	if err := json.Unmarshal(out, &rep); err != nil {
		return fmt.Errorf("read server replay's report: %w: %.200q", err, out)
	}
	res := newReplayResult(rep, run)
	b.res.Replay = res
	checkReplay(rep, b.data.Lines, &b.res.Verify)
	if res.PeakRSSMiB > 0 { // the replay command's, not the server's: kept out of PeakMiB
		b.res.RSS.Phases["replay"] = res.PeakRSSMiB
	}
	return nil
}

// childRun is how a child that ran to its end went: its exit code, wall
// time, CPU time and peak memory, from the kernel's accounting.
type childRun struct {
	code    int
	wall    time.Duration
	cpu     time.Duration
	peakMiB float64
}

// maxChildOutput bounds what the bench keeps of a child's stdout.
const maxChildOutput = 16 << 20

// runChild runs this program as `server ARGS` to its end and returns its
// stdout. Exit codes 0 and 1 (a replay's divergent verdict) are results;
// any other is an error carrying its stderr.
func (b *bench) runChild(ctx context.Context, args []string) ([]byte, childRun, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, childRun{}, fmt.Errorf("find this program: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe, append([]string{"bench"}, args...)...)
	cmd.Env = b.childEnv(b.phase)
	stdout := &cappedBuffer{max: maxChildOutput}
	stderr := &tailBuffer{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	start := time.Now()
	run := childRun{}
	if err = cmd.Start(); err == nil {
		// The peak is the child's VmHWM, read while it runs: the
		// kernel's count of a child's peak RSS (wait4's) starts from
		// this process's own peak, which the ceilings' inputs raised.
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		tick := time.NewTicker(20 * time.Millisecond)
		for waiting := true; waiting; {
			run.peakMiB = max(run.peakMiB, procPeakMiB(cmd.Process.Pid))
			select {
			case err = <-done:
				waiting = false
			case <-tick.C:
			}
		}
		tick.Stop()
	}
	run.wall = time.Since(start)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return nil, run, fmt.Errorf("run server %s: %w", args[0], err)
	}
	st := cmd.ProcessState
	run.code = st.ExitCode()
	run.cpu = st.UserTime() + st.SystemTime()
	switch {
	case stdout.over:
		return nil, run, fmt.Errorf("server %s printed more than %d bytes", args[0], maxChildOutput)
	case run.code != 0 && run.code != 1:
		return nil, run, fmt.Errorf("server %s: exit code %d: %s", args[0], run.code, stderr.String())
	}
	return stdout.b.Bytes(), run, nil
}

// newReplayResult is the bench's row of a replay's report.
func newReplayResult(rep replayReport, run childRun) *replayResult {
	s := rep.Replay
	res := &replayResult{
		phaseResult: phaseResult{Count: s.Items, Seconds: round3(s.Seconds), PerSecond: s.PerSecond,
			CPU: newCPUResult(run.cpu, 0, s.Items), PeakRSSMiB: run.peakMiB},
		CommandSeconds: round3(run.wall.Seconds()),
		Applied:        s.Applied, DeadLettered: s.DeadLettered, ReplaysSkipped: s.ReplaysSkipped, Outputs: s.Outputs,
		DecisionsDiffering: s.DecisionsDiffering, TornTails: len(s.Torn), Unconfirmed: len(s.Unconfirmed),
		Verdict: rep.Verdict,
	}
	if d := rep.Diff; d != nil {
		res.Identical = d.Identical
		res.Deliveries, res.OutputsCompared, res.TablesCompared = d.Deliveries, d.OutputsDatabase, len(d.Tables)
		for _, t := range d.Tables {
			res.RowsCompared += t.RowsDatabase
		}
	}
	return res
}

// checkReplay records in v every way the replay of a recorded run over
// lines lines is not that run: every line delivered once and applied (or
// dead-lettered) as recorded, one output each, nothing torn or left
// unconfirmed by a clean stop, and the diff identical over every line.
func checkReplay(rep replayReport, lines int64, v *verifyResult) {
	s, d := rep.Replay, rep.Diff
	if d == nil {
		v.fail("the replay made no diff")
		return
	}
	if !d.Identical || rep.Verdict != "identical" {
		at := ""
		if f := d.First; f != nil {
			at = fmt.Sprintf(", the first at partition %d epoch %s position %d", f.Partition, f.Epoch, f.Position)
		}
		v.fail("the replay diverged from the recorded run: verdict %s, %d of %d deliveries%s, %d of %d tables",
			rep.Verdict, d.Divergent, d.Deliveries, at, d.DivergentTables, len(d.Tables))
	}
	if s.Items != lines || s.Applied+s.DeadLettered != lines || s.ReplaysSkipped != 0 || s.Outputs != lines {
		v.fail("the replay handled %d items (%d applied, %d dead-lettered, %d skipped as replays) with %d outputs, for %d lines",
			s.Items, s.Applied, s.DeadLettered, s.ReplaysSkipped, s.Outputs, lines)
	}
	if s.DecisionsDiffering != 0 {
		v.fail("the replay decided %d items otherwise than recorded", s.DecisionsDiffering)
	}
	if len(s.Torn) != 0 || len(s.Unconfirmed) != 0 {
		v.fail("a cleanly stopped recording has %d torn tails and %d unconfirmed transactions", len(s.Torn), len(s.Unconfirmed))
	}
	if d.Deliveries != lines || d.OutputsDatabase != lines || d.OutputsReplayed != lines {
		v.fail("the diff compared %d deliveries, %d recorded and %d replayed outputs, for %d lines",
			d.Deliveries, d.OutputsDatabase, d.OutputsReplayed, lines)
	}
}

// cappedBuffer keeps at most max bytes, and says when more came.
type cappedBuffer struct {
	b    bytes.Buffer
	max  int
	over bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if c.b.Len()+len(p) > c.max {
		c.over = true
		return len(p), nil
	}
	return c.b.Write(p)
}

// recordRows writes the table's lines of the --record phases.
func (r *benchResult) recordLines(w io.Writer) {
	if rec := r.Recording; rec != nil {
		fmt.Fprintf(w, "record    %d bytes in %d files, %.1f bytes per line; snapshot %d bytes", rec.Bytes, rec.Files, rec.BytesPerItem, rec.SnapshotBytes)
		if in, ri := r.Ingest, r.IngestRecorded; in != nil && ri != nil && in.CPU != nil && ri.CPU != nil {
			fmt.Fprintf(w, "; CPU per line %.2f us recorded, %.2f us not (%.2f)", ri.CPU.PerItemUS, in.CPU.PerItemUS, r.Ratios.IngestRecordedCPU)
		}
		fmt.Fprintln(w)
	}
	if p := r.Replay; p != nil {
		verdict := "IDENTICAL outputs and state"
		if !p.Identical {
			verdict = "DIVERGENT (" + p.Verdict + ")"
		}
		fmt.Fprintf(w, "replay    %s to the recorded run: %d deliveries, %d outputs, %d tables of %d rows compared; %d applied, %d dead-lettered; the command took %.3fs\n",
			verdict, p.Deliveries, p.OutputsCompared, p.TablesCompared, p.RowsCompared, p.Applied, p.DeadLettered, p.CommandSeconds)
	}
}
