package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"
)

// bench is one run of `server bench`: its settings, working directory,
// broker, generated file and the results so far.
type bench struct {
	o      benchOptions
	log    *slog.Logger
	status io.Writer // progress lines

	dir     string   // removed at the end unless --keep
	prefix  string   // of every topic of the run, unique to it
	topics  []string // created by the run, deleted at the end unless --keep
	brokers []string
	broker  *benchBroker // nil with --brokers

	data    lineData
	backlog string // the ingest phase's database, drained by the relay phase
	phase   string // the phase running, which names the child's CPU profile
	res     *benchResult
}

// benchPhase is one step of the run.
type benchPhase struct {
	name string
	run  func(ctx context.Context) error
}

// runBench runs every phase in order (or the sweep) and returns the
// results gathered, also when a phase fails (then with its error).
func runBench(ctx context.Context, o benchOptions, log *slog.Logger, status io.Writer) (*benchResult, error) {
	b, err := newBench(ctx, o, log, status)
	if err != nil {
		return nil, err
	}
	if o.Sweep != "" {
		err = b.runSweep(ctx)
	} else {
		err = b.runPhases(ctx)
	}
	b.finish()
	if cerr := b.close(); err == nil {
		err = cerr
	}
	if err == nil && o.Verify && o.Sweep == "" && o.Processor != "orders" && !b.res.Verify.OK {
		err = fmt.Errorf("verification failed: %s", b.res.Verify.summary())
	}
	if err == nil && len(b.res.Verify.Failures) > 0 {
		err = fmt.Errorf("verification failed: %s", strings.Join(b.res.Verify.Failures, "; "))
	}
	return b.res, err
}

// newBench makes the working directory and finds or starts the broker.
func newBench(ctx context.Context, o benchOptions, log *slog.Logger, status io.Writer) (*bench, error) {
	b := &bench{o: o, log: log, status: status, prefix: "outboxd-bench-" + runID()}
	// The relays create these if they need them.
	b.topics = []string{b.topic("progress"), benchFeed + ".dlq"}
	b.res = newBenchResult(o)
	dir, err := os.MkdirTemp(o.Dir, "outboxd-bench-*")
	if err != nil {
		return nil, fmt.Errorf("make the working directory: %w", err)
	}
	b.dir = dir
	b.res.Settings.Dir = dir
	if err := b.connect(ctx); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// runID names a run's topics, so that runs against one cluster never see
// each other's records.
func runID() string {
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return fmt.Sprint(time.Now().UnixNano())
	}
	return hex.EncodeToString(r[:])
}

func (b *bench) runPhases(ctx context.Context) error {
	if b.o.Processor == "orders" {
		return b.runPhase(ctx, benchPhase{"ingest", b.runOrders})
	}
	phases := []benchPhase{
		{"generate", b.generate},
		{"read_floor", b.runReadFloor},
		{"commit_floor", b.runCommitFloor},
		{"raw_sqlite", b.runRawSQLite},
		{"naive_sqlite", b.runNaiveSQLite},
		{"warm_broker", b.warmBroker},
		{"raw_produce", b.runRawProduce},
		{"raw_pipeline", b.runRawPipeline},
		{"ingest", b.runIngest},
	}
	if b.o.Record {
		phases = append(phases, benchPhase{"ingest_recorded", b.runIngestRecorded}, benchPhase{"replay", b.runReplayRecording})
	}
	phases = append(phases, []benchPhase{
		{"relay", b.runRelay},
		{"end_to_end", b.runEndToEnd},
	}...)
	if b.o.NATS {
		phases = append(phases, benchPhase{"end_to_end_nats", b.runEndToEndNATS})
	}
	if b.o.Postgres != "" {
		phases = append(phases, benchPhase{"sink_postgres", b.runSinkPostgres}, benchPhase{"sink_postgres_e2e", b.runSinkPostgresE2E})
	}
	if b.o.Webhook {
		phases = append(phases, benchPhase{"sink_webhook", b.runSinkWebhook})
	}
	phases = append(phases, benchPhase{"latency", b.runLatency})
	for _, p := range phases {
		if err := b.runPhase(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// runPhase runs one phase within --timeout.
func (b *bench) runPhase(ctx context.Context, p benchPhase) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, b.o.Timeout)
	defer cancel()
	b.say("%s ...", p.name)
	b.phase = p.name
	defer func() { b.phase = "" }()
	stopProfile, err := b.startProfile(p.name)
	if err != nil {
		return err
	}
	start := time.Now()
	err = p.run(pctx)
	stopProfile()
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	b.say("%s done in %.1fs", p.name, time.Since(start).Seconds())
	return nil
}

// inProcess measures a phase that runs in the bench's own process (a
// floor): its CPU time with the broker's, and its peak memory.
type inProcess struct {
	cpu       cpuSpan
	peakReset bool
}

func (b *bench) startInProcess() *inProcess {
	m := &inProcess{cpu: cpuSpan{brokerPID: b.brokerPID()}, peakReset: resetSelfPeak()}
	m.cpu.start()
	return m
}

// finish fills res's CPU and records the phase's peak memory.
func (m *inProcess) finish(b *bench, name string, res *phaseResult) {
	proc, brok := m.cpu.since()
	res.CPU = newCPUResult(proc, brok, res.Count)
	if m.peakReset {
		if v, err := readStatusMiB("/proc/self/status", "VmHWM"); err == nil {
			b.res.RSS.Phases[name] = v
		}
	}
}

// startProfile starts a CPU profile of a phase when --cpuprofile asks for
// one; the returned function stops it. Engine phases run in the server's
// process, so their profile shows only the bench's side: the server child
// writes its own (childEnv).
func (b *bench) startProfile(phase string) (stop func(), err error) {
	if b.o.CPUProfile == "" {
		return func() {}, nil
	}
	f, err := os.Create(b.o.CPUProfile + "." + phase)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// say writes a progress line.
func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.status, "bench: "+format+"\n", args...)
}

// path is a file of the run's directory.
func (b *bench) path(name string) string { return filepath.Join(b.dir, name) }

// inputDir is the directory of the files the feeds tail, apart from the
// databases: the file feed watches its file's directory, and every write
// to a database's WAL beside the file would wake it (at a million
// accounts, a third of the server's CPU). Logs and state apart is how a
// server is deployed.
const inputDir = "input"

// inputPath names a file the feeds tail, creating its directory.
func (b *bench) inputPath(name string) (string, error) {
	dir := b.path(inputDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create input directory: %w", err)
	}
	return filepath.Join(dir, name), nil
}

// topic names one phase's output topic.
func (b *bench) topic(phase string) string { return b.prefix + "." + phase }

// finish records what is known only at the end: peak memory, ratios.
func (b *bench) finish() {
	b.res.fillRatios()
	if b.broker != nil {
		b.res.RSS.BrokerPeakMiB = b.broker.peakMiB()
	}
}

// close releases everything the run made: the topics, the broker and,
// unless --keep, the working directory.
func (b *bench) close() error {
	var errs []error
	if !b.o.Keep && len(b.topics) > 0 && b.broker == nil {
		errs = append(errs, b.deleteTopics(b.topics...))
	}
	if b.broker != nil {
		errs = append(errs, b.broker.close())
	}
	if b.dir != "" {
		if b.o.Keep {
			b.say("kept %s", b.dir)
		} else if err := os.RemoveAll(b.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", b.dir, err))
		}
	}
	return errors.Join(errs...)
}
