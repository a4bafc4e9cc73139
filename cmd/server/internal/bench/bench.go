// Package bench is `server bench`: it measures ingest, the relay, the two
// together and latency on this machine, each against a ceiling, and checks
// that every output arrived exactly once.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/server"
)

// benchOptions are the settings of `server bench`, from its flags.
type benchOptions struct {
	GOGC      int // the garbage collector's target in effect, -1 for off
	Processor string
	Lines     int64
	Accounts  int
	LineBytes int
	LineFill  string
	// Sweep names what a sweep varies ("accounts"), "" for none;
	// SweepSizes are its points and Chart the SVG it draws.
	Sweep      string
	SweepSizes []int
	Chart      string
	// LatencyRates are the offered loads (lines/s) of the latency
	// phase, one point of its curve each; none skips the phase.
	LatencyRates    []int
	LatencyDuration time.Duration
	Brokers         []string
	JSON            bool
	Synchronous     string
	BatchMax        int
	BatchWait       time.Duration
	RelayBatch      int
	RelayWait       time.Duration
	Dir             string
	Keep            bool
	Verify          bool
	Verbose         bool
	Timeout         time.Duration
	// CPUProfile names a file for a CPU profile of each phase, written
	// as FILE.<phase> (go tool pprof reads it).
	CPUProfile string
	// Record adds the phases ingest_recorded (ingest with --record) and
	// replay (server replay of that recording, diffed against its run).
	Record bool
	// NATS adds the phase end_to_end_nats (nats.go): the outputs to a
	// JetStream stream of a nats-server the bench starts.
	NATS bool
	// Postgres (a postgres:// URL) adds the PostgreSQL sink's phases
	// (sinkpg.go), their tables in its schema outboxd_bench.
	Postgres string
	// Webhook adds the webhook sink's phase (sinkhook.go).
	Webhook bool
	// DB (a postgres:// URL) runs the engine phases' servers on
	// PostgreSQL: each phase a database of its own on that server
	// (enginedb.go). The floors stay SQLite's.
	DB string
}

// defaultBenchOptions are the engine's own defaults, so that the bench
// measures what the server does unless told otherwise.
func defaultBenchOptions() benchOptions {
	d := server.DefaultConfig()
	return benchOptions{
		Processor:       "ledger",
		SweepSizes:      []int{1000, 10_000, 100_000, 1_000_000, 10_000_000},
		Lines:           1_000_000,
		Accounts:        1000,
		LineFill:        fillSpaces,
		LatencyRates:    []int{1000, 10_000, 100_000},
		LatencyDuration: 5 * time.Second,
		Synchronous:     string(d.Synchronous),
		BatchMax:        d.BatchMax,
		BatchWait:       d.BatchWait,
		RelayBatch:      d.Relay.Batch,
		RelayWait:       d.Relay.Wait,
		Verify:          true,
		Timeout:         10 * time.Minute,
	}
}

// benchFlagSet binds the bench's flags to o.
func benchFlagSet(o *benchOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int64Var(&o.Lines, "lines", o.Lines, "`N` lines of the generated ledger file (each phase handles them all)")
	fs.StringVar(&o.Processor, "processor", o.Processor, "the processor (`P`) the engine phases run: ledger, forward or orders (orders: --accounts open orders, --lines events on a Kafka topic; the ingest phase only)")
	fs.IntVar(&o.Accounts, "accounts", o.Accounts, "`N` distinct accounts (Kafka keys) in the generated file")
	fs.IntVar(&o.LineBytes, "line-bytes", o.LineBytes, "pad each line to `N` bytes, newline included (0: no padding)")
	fs.StringVar(&o.LineFill, "line-fill", o.LineFill, "what pads the lines (`FILL`): spaces (which compress to nearly nothing) or random (a space, then letters and digits that LZ4 cannot compress; --processor forward)")
	fs.StringVar(&o.Sweep, "sweep", o.Sweep, "`KIND`, accounts: measure raw_sqlite and ingest at each of --sweep-sizes accounts, the state written before each")
	fs.Func("sweep-sizes", "comma-separated account counts (`LIST`) of a sweep (default 1000,10000,100000,1000000,10000000)", func(v string) error {
		o.SweepSizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("%q is not a positive count", f)
			}
			o.SweepSizes = append(o.SweepSizes, n)
		}
		return nil
	})
	fs.StringVar(&o.Chart, "chart", o.Chart, "with --sweep, write the curve as an SVG chart to `FILE`")
	fs.Func("latency-rates", "the latency curve's offered loads, a comma-separated `LIST` of lines/s (default 1000,10000,100000; 0: skip the phase)", func(v string) error {
		o.LatencyRates = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return fmt.Errorf("%q is not a rate in lines/s", f)
			}
			if n > 0 {
				o.LatencyRates = append(o.LatencyRates, n)
			}
		}
		return nil
	})
	fs.Func("rate", "one offered load of the latency phase, `N` lines/s: --latency-rates N (0: skip the phase)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a rate in lines/s", v)
		}
		o.LatencyRates = nil
		if n > 0 {
			o.LatencyRates = []int{n}
		}
		return nil
	})
	fs.DurationVar(&o.LatencyDuration, "latency-duration", o.LatencyDuration, "how long (`D`) the latency phase appends lines at each rate")
	fs.Func("brokers", "Kafka brokers, a comma-separated `LIST` (none: a dev broker in a child process)", func(v string) error {
		o.Brokers = nil
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				o.Brokers = append(o.Brokers, b)
			}
		}
		return nil
	})
	fs.BoolVar(&o.JSON, "json", o.JSON, "print one JSON object instead of a table")
	fs.StringVar(&o.Synchronous, "synchronous", o.Synchronous, "SQLite synchronous `MODE`: full or normal")
	fs.IntVar(&o.BatchMax, "batch-max", o.BatchMax, "`N` items per ingest transaction (and per raw_sqlite transaction)")
	fs.DurationVar(&o.BatchWait, "batch-wait", o.BatchWait, "close an ingest batch `D` after its first item")
	fs.IntVar(&o.RelayBatch, "relay-batch", o.RelayBatch, "`N` rows per Kafka transaction (and per raw_produce transaction)")
	fs.DurationVar(&o.RelayWait, "relay-wait", o.RelayWait, "how long (`D`) a short relay batch waits for more rows")
	fs.StringVar(&o.Dir, "dir", o.Dir, "`DIR` (on the disk to measure) for the files and databases (default: the system temp dir)")
	fs.BoolVar(&o.NATS, "nats", o.NATS, "add the phase end_to_end_nats: the outputs relayed by a sink to JetStream (a nats-server the bench starts: Debian's package)")
	fs.StringVar(&o.Postgres, "postgres", o.Postgres, "a PostgreSQL `URL` (postgres://...): add the phases sink_postgres and sink_postgres_e2e, their tables in its schema outboxd_bench")
	fs.StringVar(&o.DB, "db", o.DB, "a PostgreSQL `URL` (postgres://...): the engine phases' servers run on it, each phase a database of its own (outboxd_bench_<phase>, made again each run); the floors stay SQLite's")
	fs.BoolVar(&o.Webhook, "webhook", o.Webhook, "add the phase sink_webhook: the webhook sink drains the ingest phase's outbox to an endpoint in the bench that answers 200")
	fs.BoolVar(&o.Keep, "keep", o.Keep, "keep the files, databases and topics")
	fs.BoolVar(&o.Verify, "verify", o.Verify, "check every output arrived exactly once and the balances (exit 1 otherwise)")
	fs.BoolVar(&o.Verbose, "verbose", o.Verbose, "show the engine's logs on stderr")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "longest (`D`) any one phase may take")
	fs.BoolVar(&o.Record, "record", o.Record, "also measure ingest with the feed recorded (ingest_recorded) and server replay of that recording, checked identical to the recorded run (replay)")
	fs.StringVar(&o.CPUProfile, "cpuprofile", o.CPUProfile, "write a CPU profile of each phase to `FILE`.<phase>, for go tool pprof, and of the server child of an engine phase (and of the replay command) to FILE.<phase>.server")
	return fs
}

// parseBenchFlags reads the bench's command line.
func parseBenchFlags(args []string) (benchOptions, error) {
	o := defaultBenchOptions()
	fs := benchFlagSet(&o)
	if err := fs.Parse(args); err != nil {
		return o, server.FlagError(fs, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, o.validate()
}

// validate reports the first invalid setting, naming its flag.
func (o benchOptions) validate() error {
	switch {
	case o.Lines < 1:
		return fmt.Errorf("--lines: %d, want at least 1", o.Lines)
	case o.Accounts < 1:
		return fmt.Errorf("--accounts: %d, want at least 1", o.Accounts)
	case o.Processor != "ledger" && o.Processor != "forward" && o.Processor != "orders":
		return fmt.Errorf("--processor: %q is not one of ledger, forward, orders", o.Processor)
	case o.LineBytes < 0 || o.LineBytes > server.DefaultConfig().MaxLine:
		return fmt.Errorf("--line-bytes: %d, want 0 to %d", o.LineBytes, server.DefaultConfig().MaxLine)
	case o.LineFill != fillSpaces && o.LineFill != fillRandom:
		return fmt.Errorf("--line-fill: %q is not spaces or random", o.LineFill)
	case o.LineFill == fillRandom && o.Processor != "forward":
		return fmt.Errorf("--line-fill random: the %s processor reads the line whole: give --processor forward", o.Processor)
	case o.Postgres != "" && !strings.HasPrefix(o.Postgres, "postgres://") && !strings.HasPrefix(o.Postgres, "postgresql://"):
		return fmt.Errorf("--postgres: want a postgres:// URL")
	case o.DB != "" && !outbox.IsPostgres(o.DB):
		return fmt.Errorf("--db: want a postgres:// URL (the bench's SQLite databases are its own files)")
	case o.DB != "" && (o.Record || o.Sweep != ""):
		return fmt.Errorf("--db: the recording and the sweep compare SQLite files: leave out --record and --sweep")
	case o.Sweep != "" && o.Sweep != "accounts":
		return fmt.Errorf("--sweep: %q is not accounts", o.Sweep)
	case o.Sweep != "" && o.Processor == "forward":
		return fmt.Errorf("--sweep accounts: forward keeps no state: give --processor ledger or orders")
	case o.Chart != "" && o.Sweep == "":
		return fmt.Errorf("--chart: draws a sweep: give --sweep accounts")
	case o.Record && o.Sweep != "":
		return fmt.Errorf("--record: measures the recording of one ingest run, not a sweep: leave out --sweep")
	case o.Record && o.Processor == "orders":
		return fmt.Errorf("--record: measures the file feed's recording: give --processor ledger or forward")
	case len(o.SweepSizes) == 0:
		return fmt.Errorf("--sweep-sizes: none given")
	case len(o.LatencyRates) > 0 && o.LatencyDuration < 100*time.Millisecond:
		return fmt.Errorf("--latency-duration: %v, want at least 100ms", o.LatencyDuration)
	case outbox.SyncMode(o.Synchronous) != outbox.SyncFull && outbox.SyncMode(o.Synchronous) != outbox.SyncNormal:
		return fmt.Errorf("--synchronous: %q is not one of full, normal", o.Synchronous)
	case o.BatchMax < 1:
		return fmt.Errorf("--batch-max: %d, want at least 1", o.BatchMax)
	case o.BatchWait < 0:
		return fmt.Errorf("--batch-wait: %v is negative", o.BatchWait)
	case o.RelayWait < 0:
		return fmt.Errorf("--relay-wait: %v is negative", o.RelayWait)
	case o.Timeout <= 0:
		return fmt.Errorf("--timeout: %v, want more than 0", o.Timeout)
	}
	rc := relay.DefaultConfig()
	rc.Batch = o.RelayBatch
	if err := rc.Validate(); err != nil {
		return fmt.Errorf("--relay-batch: %w", err)
	}
	return nil
}

// latencyLines is how many lines the latency phase appends at rate.
func (o benchOptions) latencyLines(rate int) int64 {
	return int64(float64(rate) * o.LatencyDuration.Seconds())
}

// Command runs `server bench`: it measures each stage of the engine
// against its ceiling on this machine and prints the results. It returns
// 0, 2 for a bad command line, or 1 when a phase or the verification failed.
// Started by a bench with envBenchBroker set, it is that bench's broker.
func Command(args []string, stdout, stderr io.Writer) int {
	if os.Getenv(envBenchBroker) != "" {
		return benchBrokerChild(os.Stdin, stdout, stderr)
	}
	if os.Getenv(envBenchServer) != "" {
		return runServerChild(args, stdout, stderr)
	}
	o, err := parseBenchFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		benchUsage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%[1]s bench: %[2]s (see %[1]s bench -h)\n", server.ProgramName(), strings.ReplaceAll(err.Error(), "\n", "; "))
		return 2
	}
	o.GOGC = server.TuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := runBench(ctx, o, benchLogger(o, stderr), stderr)
	if res != nil {
		if perr := res.print(stdout, o.JSON); perr != nil && err == nil {
			err = fmt.Errorf("print results: %w", perr)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

// benchLogger is where the engine logs: nowhere, unless --verbose.
func benchLogger(o benchOptions, stderr io.Writer) *slog.Logger {
	if !o.Verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// benchUsage prints the bench's help, in the style of the server's.
func benchUsage(w io.Writer) {
	o := defaultBenchOptions()
	fs := benchFlagSet(&o)
	server.CommandHelp(w, "bench [flags]", `Measures, on this machine and disk, in one run: the floors (the file feed `+
		`read with no store, a commit per batch), the ceilings (a plain SQLite loop writing exactly the engine's rows `+
		`through the store's DSN and statements, raw_sqlite; the relay's producer sending its records, raw_produce; the `+
		`two at once, each batch's records sent once it is committed, raw_pipeline, the end-to-end ceiling) and the naive `+
		`three-statements-per-line loop; then the server itself, in a child process: file -> SQLite (ingest), its relay `+
		`draining that outbox (relay), file -> Kafka (end_to_end), and the append-to-visible latency at each of `+
		`--latency-rates (its curve, beside the disk's fdatasync latency, which a commit of synchronous=full waits for), `+
		`with the CPU time and memory of each. --record adds ingest with the feed recorded (ingest_recorded) and `+
		`replay of that recording, diffed against its run (replay). --sweep accounts measures raw_sqlite and ingest `+
		`at growing state sizes instead. Progress goes to stderr, results to stdout.`,
		fs, "bench", "bench --lines 1000000 --json > bench.json", "bench --sweep accounts --chart sweep.svg")
}
