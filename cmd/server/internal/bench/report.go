package bench

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxd/outboxd/server"
)

// benchResult is everything a run measured. Its JSON field names are
// stable: scripts read them. A phase that did not run is null.
type benchResult struct {
	ReadFloor   *phaseResult `json:"read_floor"`
	CommitFloor *phaseResult `json:"commit_floor"`
	RawSQLite   *phaseResult `json:"raw_sqlite"`
	NaiveSQLite *phaseResult `json:"naive_sqlite"`
	RawProduce  *phaseResult `json:"raw_produce"`
	RawPipeline *phaseResult `json:"raw_pipeline"`
	Ingest      *phaseResult `json:"ingest"`
	// IngestRecorded, Recording and Replay are measured with --record
	// (record.go), null without.
	IngestRecorded *phaseResult     `json:"ingest_recorded"`
	Recording      *recordingResult `json:"recording"`
	Replay         *replayResult    `json:"replay"`
	Relay          *phaseResult     `json:"relay"`
	EndToEnd       *phaseResult     `json:"end_to_end"`
	// EndToEndNATS is end_to_end to a JetStream stream through a sink
	// (nats.go), null where nats-server is missing.
	EndToEndNATS *phaseResult `json:"end_to_end_nats"`
	// SinkPostgres and SinkPostgresE2E are measured with --postgres
	// (sinkpg.go), null without.
	SinkPostgres    *phaseResult `json:"sink_postgres"`
	SinkPostgresE2E *phaseResult `json:"sink_postgres_e2e"`
	// SinkWebhook is measured with --webhook (sinkhook.go), null without.
	SinkWebhook *phaseResult `json:"sink_webhook"`
	Ratios      benchRatios  `json:"ratios"`
	// Latency is the latency curve's point at 10,000 lines/s (its first
	// point when it lacks that rate), LatencyCurve every point, one per
	// --latency-rates, and FDataSync the disk's durable-write latency
	// measured before them, the floor of any commit's.
	Latency      *latencyResult   `json:"latency"`
	LatencyCurve []*latencyResult `json:"latency_curve"`
	FDataSync    *syncResult      `json:"fdatasync"`
	Sweep        *sweepResult     `json:"sweep,omitempty"`
	RSS          rssResult        `json:"rss"`
	Verify       verifyResult     `json:"verify"`
	Settings     benchSettings    `json:"settings"`
}

// phaseResult is one throughput measurement.
type phaseResult struct {
	Count     int64   `json:"count"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	// StartupSeconds (relay only) is the time from the server's start to
	// its first published transaction, not counted in Seconds.
	StartupSeconds float64 `json:"startup_seconds,omitempty"`
	// CPU is the CPU time the phase took: the process doing the work (the
	// server for the engine phases, the bench for the floors) and the
	// broker child.
	CPU *cpuResult `json:"cpu,omitempty"`
	// PeakRSSMiB (engine phases) is the server's peak resident memory.
	PeakRSSMiB float64 `json:"peak_rss_mib,omitempty"`
}

// newPhaseResult is n items in d.
func newPhaseResult(n int64, d time.Duration) *phaseResult {
	p := &phaseResult{Count: n, Seconds: round3(d.Seconds())}
	if d > 0 {
		p.PerSecond = math.Round(float64(n) / d.Seconds())
	}
	return p
}

// benchRatios compare the engine's stages to their ceilings (1 = as fast):
// ingest to raw_sqlite, the relay to raw_produce, end_to_end to
// raw_pipeline (both ceilings' work at once, sharing the machine as the
// server's stages do).
type benchRatios struct {
	IngestRawSQLite float64 `json:"ingest_raw_sqlite"`
	RelayRawProduce float64 `json:"relay_raw_produce"`
	EndToEndCeiling float64 `json:"end_to_end_ceiling"`
	// The same three by CPU per item, the ceiling's over the engine's
	// (1 = the engine spends no more CPU an item than its ceiling): far
	// steadier than the rates on a shared machine.
	IngestRawSQLiteCPU float64 `json:"ingest_raw_sqlite_cpu"`
	RelayRawProduceCPU float64 `json:"relay_raw_produce_cpu"`
	EndToEndCeilingCPU float64 `json:"end_to_end_ceiling_cpu"`
	// IngestRecorded is ingest_recorded / ingest in lines/s (1 = recording
	// costs nothing), IngestRecordedCPU the same of their CPU per line
	// (1.05 = recording costs 5% more CPU); 0 without --record.
	IngestRecorded    float64 `json:"ingest_recorded_ingest"`
	IngestRecordedCPU float64 `json:"ingest_recorded_ingest_cpu"`
}

// latencyResult is the append-to-visible latency at a fixed offered load.
type latencyResult struct {
	Rate    int     `json:"rate"`
	Seconds float64 `json:"seconds"`
	Lines   int64   `json:"lines"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	// AchievedRate is the lines/s the writer appended (below Rate when
	// the machine could not keep to it).
	AchievedRate float64 `json:"achieved_rate"`
	// P99OverFdatasync is P99Ms over the disk's fdatasync p99 (1: a
	// line waits no longer than one durable write at p99).
	P99OverFdatasync float64 `json:"p99_over_fdatasync"`
	// ToRelay* are the percentiles of append -> the relay made the
	// line's batch (its record's timestamp, to the millisecond): the file
	// feed, the loop's batch and commit, the relay's wait. FromRelay* are
	// those of the rest: the Kafka transaction and the consumer's fetch.
	ToRelayP50Ms   float64 `json:"to_relay_p50_ms"`
	ToRelayP99Ms   float64 `json:"to_relay_p99_ms"`
	FromRelayP50Ms float64 `json:"from_relay_p50_ms"`
	FromRelayP99Ms float64 `json:"from_relay_p99_ms"`
}

// rssResult is the bench process's resident memory, in MiB. With the dev
// broker in a child process, the broker's is apart (BrokerPeakMiB).
type rssResult struct {
	// PeakMiB is the server's largest peak resident memory over the
	// engine phases: outboxd's own (the broker runs apart).
	PeakMiB float64 `json:"peak_mib"`
	// Phases is each phase's peak: the server's for the engine phases,
	// the bench's own for the floors.
	Phases        map[string]float64 `json:"phases"`
	BrokerPeakMiB float64            `json:"broker_peak_mib,omitempty"`
}

// notePeak records an engine phase's server peak.
func (r *rssResult) notePeak(phase string, mib float64) {
	if mib <= 0 {
		return
	}
	r.Phases[phase] = mib
	r.PeakMiB = max(r.PeakMiB, mib)
}

// verifyResult is the correctness check of the end-to-end (and latency)
// outputs. OK is true only when the check ran and found nothing wrong.
type verifyResult struct {
	Enabled           bool     `json:"enabled"`
	OK                bool     `json:"ok"`
	Outputs           int64    `json:"outputs"`
	Duplicates        int64    `json:"duplicates"`
	Missing           int64    `json:"missing"`
	Foreign           int64    `json:"foreign"`
	BalancesChecked   int      `json:"balances_checked"`
	LatencyDuplicates int64    `json:"latency_duplicates"`
	Failures          []string `json:"failures,omitempty"`
}

// fail records a failure.
func (v *verifyResult) fail(format string, args ...any) {
	v.Failures = append(v.Failures, fmt.Sprintf(format, args...))
}

// summary is the failures on one line.
func (v *verifyResult) summary() string {
	if !v.Enabled {
		return "the check did not run"
	}
	return strings.Join(v.Failures, "; ")
}

// benchSettings are the settings a run used.
type benchSettings struct {
	Processor   string `json:"processor"`
	Lines       int64  `json:"lines"`
	Accounts    int    `json:"accounts"`
	LineBytes   int    `json:"line_bytes"`
	LineFill    string `json:"line_fill"`
	FileBytes   int64  `json:"file_bytes"`
	Synchronous string `json:"synchronous"`
	BatchMax    int    `json:"batch_max"`
	BatchWait   string `json:"batch_wait"`
	RelayBatch  int    `json:"relay_batch"`
	RelayWait   string `json:"relay_wait"`
	Partitions  int32  `json:"partitions"`
	// PipelineBatch is raw_pipeline's lines per transaction (0: it did
	// not run).
	PipelineBatch int64  `json:"pipeline_batch"`
	Broker        string `json:"broker"`
	Dir           string `json:"dir"`
	SQLiteVersion string `json:"sqlite_version"`
	GoVersion     string `json:"go_version"`
	CPUs          int    `json:"cpus"`
	GOMAXPROCS    int    `json:"gomaxprocs"`
	GOGC          int    `json:"gogc"` // -1: off
	// ServerMemLimit is the engine phases' Go memory limit: the server's
	// default for one feed, or GOMEMLIMIT as set.
	ServerMemLimit string `json:"server_gomemlimit"`
	OS             string `json:"os"`
	Arch           string `json:"arch"`
	Record         bool   `json:"record"`
}

// newBenchResult starts a result with the run's settings.
func newBenchResult(o benchOptions) *benchResult {
	return &benchResult{
		RSS: rssResult{Phases: map[string]float64{}},
		Settings: benchSettings{
			Processor: o.Processor, Lines: o.Lines, Accounts: o.Accounts, LineBytes: o.LineBytes, LineFill: o.LineFill, Synchronous: o.Synchronous,
			BatchMax: o.BatchMax, BatchWait: o.BatchWait.String(), RelayBatch: o.RelayBatch, RelayWait: o.RelayWait.String(),
			Partitions: topicPartitions, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0), GOGC: o.GOGC, OS: runtime.GOOS, Arch: runtime.GOARCH, Record: o.Record,
			ServerMemLimit: serverMemLimit(), SQLiteVersion: sqliteVersion(),
		},
	}
}

// fillRatios computes the ratios of the phases that ran, and whether the
// verification passed.
func (r *benchResult) fillRatios() {
	r.Ratios.IngestRawSQLite = ratio(r.Ingest, r.RawSQLite)
	r.Ratios.RelayRawProduce = ratio(r.Relay, r.RawProduce)
	r.Ratios.EndToEndCeiling = ratio(r.EndToEnd, r.RawPipeline)
	r.Ratios.IngestRawSQLiteCPU = cpuRatio(r.RawSQLite, r.Ingest)
	r.Ratios.RelayRawProduceCPU = cpuRatio(r.RawProduce, r.Relay)
	r.Ratios.EndToEndCeilingCPU = cpuRatio(r.RawPipeline, r.EndToEnd)
	r.Ratios.IngestRecorded = ratio(r.IngestRecorded, r.Ingest)
	r.Ratios.IngestRecordedCPU = cpuRatio(r.IngestRecorded, r.Ingest)
	r.Verify.OK = r.Verify.Enabled && len(r.Verify.Failures) == 0
}

func ratio(a, b *phaseResult) float64 {
	if a == nil || b == nil || b.PerSecond == 0 {
		return 0
	}
	return round3(a.PerSecond / b.PerSecond)
}

// cpuRatio is a's CPU per item over b's (0 if either is unknown).
func cpuRatio(a, b *phaseResult) float64 {
	if a == nil || b == nil || a.CPU == nil || b.CPU == nil || b.CPU.PerItemUS == 0 {
		return 0
	}
	return round3(a.CPU.PerItemUS / b.CPU.PerItemUS)
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }
func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// print writes the result as one JSON object or as a table.
func (r *benchResult) print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return r.table(w)
}

// table writes the result for people.
func (r *benchResult) table(w io.Writer) error {
	s := r.Settings
	if r.Sweep != nil {
		fmt.Fprintf(w, "outboxd bench: %s, sweep of %s, %d lines per point\n\n", s.Processor, r.Sweep.Of, s.Lines)
		if err := r.Sweep.table(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
		r.settingsLines(w)
		return nil
	}
	fmt.Fprintf(w, "outboxd bench: %s, %d lines (%.1f MiB), %d accounts, %s\n\n",
		s.Processor, s.Lines, float64(s.FileBytes)/(1<<20), s.Accounts, s.Broker)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tcount\tseconds\tper second\tCPU/item\tpeak RSS\tratio\t")
	rows := []struct {
		name, unit, ratio string
		p                 *phaseResult
	}{
		{"read_floor", "lines/s", "", r.ReadFloor},
		{"commit_floor", "lines/s", "", r.CommitFloor},
		{"raw_sqlite", "lines/s", "", r.RawSQLite},
		{"naive_sqlite", "lines/s", "", r.NaiveSQLite},
		{"raw_produce", "records/s", "", r.RawProduce},
		{"raw_pipeline", "lines/s", "", r.RawPipeline},
		{"ingest", "lines/s", ratioText(r.Ratios.IngestRawSQLite, "raw_sqlite", r.Ratios.IngestRawSQLiteCPU), r.Ingest},
		{"ingest_recorded", "lines/s", ratioText(r.Ratios.IngestRecorded, "ingest", 0), r.IngestRecorded},
		{"replay", "items/s", "", r.replayPhase()},
		{"relay", "records/s", ratioText(r.Ratios.RelayRawProduce, "raw_produce", r.Ratios.RelayRawProduceCPU), r.Relay},
		{"end_to_end", "lines/s", ratioText(r.Ratios.EndToEndCeiling, "raw_pipeline", r.Ratios.EndToEndCeilingCPU), r.EndToEnd},
		{"end_to_end_nats", "lines/s", "", r.EndToEndNATS},
		{"sink_postgres", "rows/s", "", r.SinkPostgres},
		{"sink_postgres_e2e", "lines/s", "", r.SinkPostgresE2E},
		{"sink_webhook", "requests/s", "", r.SinkWebhook},
	}
	for _, row := range rows {
		if row.p == nil && !s.Record && (row.name == "ingest_recorded" || row.name == "replay") {
			continue
		}
		if row.p == nil && (strings.HasPrefix(row.name, "sink_") || row.name == "end_to_end_nats") {
			continue
		}
		if row.p == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t\t\t\t\n", row.name)
			continue
		}
		rss := ""
		if v := r.RSS.Phases[row.name]; v > 0 {
			rss = fmt.Sprintf("%.1f MiB", v)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.0f %s\t%s\t%s\t%s\t\n", row.name, row.p.Count, row.p.Seconds, row.p.PerSecond, row.unit,
			row.p.CPU.String(), rss, row.ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	r.recordLines(w)
	r.tail(w)
	return nil
}

// replayPhase is the replay's throughput row, nil when it did not run.
func (r *benchResult) replayPhase() *phaseResult {
	if r.Replay == nil {
		return nil
	}
	return &r.Replay.phaseResult
}

// tail writes the latency, memory, verification and settings lines.
func (r *benchResult) tail(w io.Writer) {
	r.latencyLines(w)
	m := r.RSS
	fmt.Fprintf(w, "memory    the server's peak RSS %.1f MiB", m.PeakMiB)
	if m.BrokerPeakMiB > 0 {
		fmt.Fprintf(w, "; broker process peak %.1f MiB", m.BrokerPeakMiB)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "cpu       CPU/item is user+sys of the process doing the work and of the broker child, per line or record\n")
	fmt.Fprintf(w, "verify    %s\n", r.verifyText())
	r.settingsLines(w)
}

// latencyLines writes the latency curve, one line per rate, after the
// disk's fdatasync latency.
func (r *benchResult) latencyLines(w io.Writer) {
	if d := r.FDataSync; d != nil {
		fmt.Fprintf(w, "fdatasync %d durable 4 KiB writes on the databases' disk: p50 %.2f ms, p99 %.2f ms, max %.2f ms (a commit's floor)\n",
			d.Count, d.P50Ms, d.P99Ms, d.MaxMs)
	}
	for _, l := range r.LatencyCurve {
		fmt.Fprintf(w, "latency   %d lines at %d lines/s (achieved %.0f) for %gs, append -> visible (read_committed): "+
			"p50 %.1f ms, p99 %.1f ms (%.1fx fdatasync p99), max %.1f ms; append -> relay batch p50/p99 %.1f/%.1f ms, "+
			"relay batch -> visible %.1f/%.1f ms\n",
			l.Lines, l.Rate, l.AchievedRate, l.Seconds, l.P50Ms, l.P99Ms, l.P99OverFdatasync, l.MaxMs,
			l.ToRelayP50Ms, l.ToRelayP99Ms, l.FromRelayP50Ms, l.FromRelayP99Ms)
	}
}

// settingsLines writes the settings a run used.
func (r *benchResult) settingsLines(w io.Writer) {
	s := r.Settings
	fmt.Fprintf(w, "settings  processor=%s line_bytes=%d line_fill=%s synchronous=%s batch_max=%d batch_wait=%s relay_batch=%d relay_wait=%s partitions=%d",
		s.Processor, s.LineBytes, s.LineFill, s.Synchronous, s.BatchMax, s.BatchWait, s.RelayBatch, s.RelayWait, s.Partitions)
	if s.PipelineBatch > 0 {
		fmt.Fprintf(w, " pipeline_batch=%d", s.PipelineBatch)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "          %s cpus=%d gomaxprocs=%d gogc=%d server_gomemlimit=%s %s/%s sqlite=%s dir=%s\n",
		s.GoVersion, s.CPUs, s.GOMAXPROCS, s.GOGC, s.ServerMemLimit, s.OS, s.Arch, s.SQLiteVersion, s.Dir)
}

// verifyText is the verification's outcome on one line.
func (r *benchResult) verifyText() string {
	v := r.Verify
	switch {
	case !v.Enabled:
		return "not run"
	case !v.OK:
		return "FAILED: " + v.summary()
	}
	if r.Settings.Processor != "ledger" {
		return fmt.Sprintf("ok: each of %d lines has exactly one output (read_committed), and the values are the lines", v.Outputs)
	}
	return fmt.Sprintf("ok: each of %d lines has exactly one output (read_committed), %d balances match in SQLite and Kafka",
		v.Outputs, v.BalancesChecked)
}

// ratioText is a rate's ratio to a ceiling's and, when known, the
// ceiling's CPU per item over the phase's.
func ratioText(f float64, of string, cpu float64) string {
	if f == 0 {
		return ""
	}
	if cpu == 0 {
		return fmt.Sprintf("%.2f of %s", f, of)
	}
	return fmt.Sprintf("%.2f of %s (CPU %.2f)", f, of, cpu)
}

// serverMemLimit is the Go memory limit of the server's engine phases (one
// feed each): GOMEMLIMIT when the environment sets it, else the server's
// default (server.TuneMemory).
func serverMemLimit() string {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		return v
	}
	return fmt.Sprintf("%dMiB", server.MemoryLimit(1)>>20)
}

// sqliteVersion is the version of the SQLite the store links, or "" if an
// in-memory database cannot say.
func sqliteVersion() string {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		return ""
	}
	defer db.Close()
	var v string
	if err := db.QueryRow(`SELECT sqlite_version()`).Scan(&v); err != nil {
		return ""
	}
	return v
}
