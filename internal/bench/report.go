package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

// benchResult is everything a run measured. Its JSON field names are
// stable: scripts read them. A phase that did not run is null.
type benchResult struct {
	RawSQLite  *phaseResult `json:"raw_sqlite"`
	RawProduce *phaseResult `json:"raw_produce"`
	Ingest     *phaseResult `json:"ingest"`
	// IngestRecorded and Replay run with --record (record.go).
	IngestRecorded *phaseResult   `json:"ingest_recorded"`
	Replay         *replayResult  `json:"replay"`
	Relay          *phaseResult   `json:"relay"`
	EndToEnd       *phaseResult   `json:"end_to_end"`
	Ratios         benchRatios    `json:"ratios"`
	Latency        *latencyResult `json:"latency"`
	RSS            rssResult      `json:"rss"`
	Verify         verifyResult   `json:"verify"`
	Settings       benchSettings  `json:"settings"`
}

// phaseResult is one throughput measurement.
type phaseResult struct {
	Count     int64   `json:"count"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	// StartupSeconds (relay only) is the time from start to connected,
	// not counted in Seconds.
	StartupSeconds float64 `json:"startup_seconds,omitempty"`
	// CPUMicrosPerItem (ingest phases) is the process's CPU time (user
	// and system) over the phase, per item, in microseconds.
	CPUMicrosPerItem float64 `json:"cpu_us_per_item,omitempty"`
}

// newPhaseResult is n items in d.
func newPhaseResult(n int64, d time.Duration) *phaseResult {
	p := &phaseResult{Count: n, Seconds: round3(d.Seconds())}
	if d > 0 {
		p.PerSecond = math.Round(float64(n) / d.Seconds())
	}
	return p
}

// benchRatios compare the engine's stages to their ceilings (1 = as fast).
type benchRatios struct {
	IngestRawSQLite   float64 `json:"ingest_raw_sqlite"`
	RelayRawProduce   float64 `json:"relay_raw_produce"`
	EndToEndRawSQLite float64 `json:"end_to_end_raw_sqlite"`
	// IngestRecordedIngest is ingest_recorded / ingest (with --record).
	IngestRecordedIngest float64 `json:"ingest_recorded_ingest,omitempty"`
}

// latencyResult is the append-to-visible latency at a fixed offered load.
type latencyResult struct {
	Rate    int     `json:"rate"`
	Seconds float64 `json:"seconds"`
	Lines   int64   `json:"lines"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// rssResult is the bench process's resident memory, in MiB. With the dev
// broker in a child process, the broker's is apart (BrokerPeakMiB).
type rssResult struct {
	PeakMiB float64 `json:"peak_mib"`
	// RelayDrain*: sampled every 50ms while the relay drained the ingest
	// phase's outbox of RelayDrainRows rows.
	RelayDrainRows     int64   `json:"relay_drain_rows"`
	RelayDrainStartMiB float64 `json:"relay_drain_start_mib"`
	RelayDrainMaxMiB   float64 `json:"relay_drain_max_mib"`
	RelayDrainEndMiB   float64 `json:"relay_drain_end_mib"`
	// The largest sample of each half of the drain: equal when the
	// memory stays flat as the backlog shrinks.
	RelayDrainFirstHalfMaxMiB  float64 `json:"relay_drain_first_half_max_mib"`
	RelayDrainSecondHalfMaxMiB float64 `json:"relay_drain_second_half_max_mib"`
	RelayDrainSamples          int     `json:"relay_drain_samples"`
	// Phases is each phase's largest sample.
	Phases        map[string]float64 `json:"phases"`
	BrokerPeakMiB float64            `json:"broker_peak_mib,omitempty"`
}

// setDrain records the relay drain's samples.
func (r *rssResult) setDrain(w rssWindow, rows int64) {
	r.RelayDrainRows, r.RelayDrainSamples = rows, w.Samples
	r.RelayDrainStartMiB, r.RelayDrainMaxMiB, r.RelayDrainEndMiB = w.StartMiB, w.MaxMiB, w.EndMiB
	r.RelayDrainFirstHalfMaxMiB, r.RelayDrainSecondHalfMaxMiB = w.FirstHalfMaxMiB, w.SecondHalfMaxMiB
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
	Lines         int64  `json:"lines"`
	Accounts      int    `json:"accounts"`
	FileBytes     int64  `json:"file_bytes"`
	Synchronous   string `json:"synchronous"`
	BatchMax      int    `json:"batch_max"`
	BatchWait     string `json:"batch_wait"`
	RelayBatch    int    `json:"relay_batch"`
	RelayWait     string `json:"relay_wait"`
	Partitions    int32  `json:"partitions"`
	Broker        string `json:"broker"`
	Dir           string `json:"dir"`
	SQLiteVersion string `json:"sqlite_version"`
	GoVersion     string `json:"go_version"`
	CPUs          int    `json:"cpus"`
	GOMAXPROCS    int    `json:"gomaxprocs"`
	GOGC          int    `json:"gogc"` // -1: off
	OS            string `json:"os"`
	Arch          string `json:"arch"`
	Record        bool   `json:"record"`
}

// newBenchResult starts a result with the run's settings.
func newBenchResult(o benchOptions) *benchResult {
	return &benchResult{
		RSS: rssResult{Phases: map[string]float64{}},
		Settings: benchSettings{
			Lines: o.Lines, Accounts: o.Accounts, Synchronous: o.Synchronous,
			BatchMax: o.BatchMax, BatchWait: o.BatchWait.String(), RelayBatch: o.RelayBatch, RelayWait: o.RelayWait.String(),
			Partitions: topicPartitions, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0), GOGC: o.GOGC, OS: runtime.GOOS, Arch: runtime.GOARCH, Record: o.Record,
		},
	}
}

// fillRatios computes the ratios of the phases that ran, and whether the
// verification passed.
func (r *benchResult) fillRatios() {
	r.Ratios.IngestRawSQLite = ratio(r.Ingest, r.RawSQLite)
	r.Ratios.RelayRawProduce = ratio(r.Relay, r.RawProduce)
	r.Ratios.EndToEndRawSQLite = ratio(r.EndToEnd, r.RawSQLite)
	r.Ratios.IngestRecordedIngest = ratio(r.IngestRecorded, r.Ingest)
	r.Verify.OK = r.Verify.Enabled && len(r.Verify.Failures) == 0
}

func ratio(a, b *phaseResult) float64 {
	if a == nil || b == nil || b.PerSecond == 0 {
		return 0
	}
	return round3(a.PerSecond / b.PerSecond)
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
	fmt.Fprintf(w, "outboxd bench: %d lines (%.1f MiB), %d accounts, %s\n\n",
		s.Lines, float64(s.FileBytes)/(1<<20), s.Accounts, s.Broker)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tcount\tseconds\tper second\tratio\t")
	rows := []struct {
		name, unit, ratio string
		p                 *phaseResult
	}{
		{"raw_sqlite", "lines/s", "", r.RawSQLite},
		{"raw_produce", "records/s", "", r.RawProduce},
		{"ingest", "lines/s", ratioText(r.Ratios.IngestRawSQLite, "raw_sqlite"), r.Ingest},
		{"ingest_recorded", "lines/s", ratioText(r.Ratios.IngestRecordedIngest, "ingest"), r.IngestRecorded},
		{"relay", "records/s", ratioText(r.Ratios.RelayRawProduce, "raw_produce"), r.Relay},
		{"end_to_end", "lines/s", ratioText(r.Ratios.EndToEndRawSQLite, "raw_sqlite"), r.EndToEnd},
	}
	for _, row := range rows {
		if row.p == nil {
			if row.name != "ingest_recorded" || r.Settings.Record {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t\t\n", row.name)
			}
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.0f %s\t%s\t\n", row.name, row.p.Count, row.p.Seconds, row.p.PerSecond, row.unit, row.ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	r.recordLines(w)
	r.tail(w)
	return nil
}

func ratioText(f float64, of string) string {
	if f == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f of %s", f, of)
}

// tail writes the latency, memory, verification and settings lines.
func (r *benchResult) tail(w io.Writer) {
	if l := r.Latency; l != nil {
		fmt.Fprintf(w, "latency   %d lines at %d lines/s for %gs, append -> visible (read_committed): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			l.Lines, l.Rate, l.Seconds, l.P50Ms, l.P99Ms, l.MaxMs)
	}
	m := r.RSS
	fmt.Fprintf(w, "memory    peak RSS %.1f MiB", m.PeakMiB)
	if m.RelayDrainSamples > 0 {
		fmt.Fprintf(w, "; while the relay drained %d rows: %.1f at the start, max %.1f in the first half, %.1f in the second (%d samples)",
			m.RelayDrainRows, m.RelayDrainStartMiB, m.RelayDrainFirstHalfMaxMiB, m.RelayDrainSecondHalfMaxMiB, m.RelayDrainSamples)
	}
	if m.BrokerPeakMiB > 0 {
		fmt.Fprintf(w, "; broker process peak %.1f MiB", m.BrokerPeakMiB)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "verify    %s\n", r.verifyText())
	s := r.Settings
	fmt.Fprintf(w, "settings  synchronous=%s batch_max=%d batch_wait=%s relay_batch=%d relay_wait=%s partitions=%d\n",
		s.Synchronous, s.BatchMax, s.BatchWait, s.RelayBatch, s.RelayWait, s.Partitions)
	fmt.Fprintf(w, "          %s cpus=%d gomaxprocs=%d gogc=%d %s/%s sqlite=%s dir=%s\n",
		s.GoVersion, s.CPUs, s.GOMAXPROCS, s.GOGC, s.OS, s.Arch, s.SQLiteVersion, s.Dir)
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
	return fmt.Sprintf("ok: each of %d lines has exactly one output (read_committed), %d balances match in SQLite and Kafka",
		v.Outputs, v.BalancesChecked)
}
