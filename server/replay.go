package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/forward"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// Exit codes of the replay command.
const (
	// ReplayIdentical: the replay ran (and, with --diff, matched).
	ReplayIdentical = 0
	// ReplayDivergent: with --diff, the outputs or the state differ.
	ReplayDivergent = 1
	// ReplayFailed: a bad recording or flag, or a replay that could not
	// be made.
	ReplayFailed = 2
)

const replaySynopsis = "replay RECORDING... [--config FILE | --processor P] [--db OUT] [--from DB] [--diff [DB]] [--json]"

// replayOptions are the replay command's flags.
type replayOptions struct {
	Processor string
	Config    string
	DB        string
	Diff      string
	// DiffRecorded is --diff with no database: compare with the recorded
	// processor's replay of the same recordings.
	DiffRecorded bool
	DiffKeys     int
	From         string
	JSON         bool
	Verbose      bool
	Paths        []string

	procs *registry // the processors a replay may name
	opts  []Option  // the caller's, for --config
}

// replayCommand replays recordings (files, or directories of them) and,
// with --diff, compares the result with a database.
func replayCommand(ctx context.Context, args []string, stdout, stderr io.Writer, opts ...Option) int {
	o, code, done := parseReplay(args, stdout, stderr)
	if done {
		return code
	}
	if o.procs = newOptions(opts).procs; o.procs.err != nil {
		return badUsage(stderr, o.procs.err)
	}
	o.opts = opts
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.Verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	rep, err := runReplay(ctx, o, logger)
	if err != nil {
		fmt.Fprintf(stderr, "%s replay: %s\n", programName, oneLine(err.Error()))
		return ReplayFailed
	}
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "%s replay: %v\n", programName, err)
			return ReplayFailed
		}
	} else {
		rep.print(stdout)
	}
	if rep.Diff != nil && !rep.Diff.Identical {
		return ReplayDivergent
	}
	return ReplayIdentical
}

// parseReplay reads the flags, which may come before, between or after
// the recordings. done says the command must return code now.
func parseReplay(args []string, stdout, stderr io.Writer) (replayOptions, int, bool) {
	var o replayOptions
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.Processor, "processor", "", "the processor (`P`) to replay with: forward, ledger or orders (default: the recorded one)")
	fs.StringVar(&o.Config, "config", "", "build the feed's processor from this configuration (`FILE`: the server's, or a new version of it) "+
		"rather than from the recording's header")
	fs.StringVar(&o.DB, "db", "", "the database (`OUT`) to replay into: made from the first recording's snapshot when missing, "+
		"taken as it is when it exists (a replay of the recordings before); default: a temporary one")
	fs.StringVar(&o.From, "from", "", "start from a copy of this database (`DB`; yours, or the live one: it is only read) "+
		"rather than the recording's snapshot; --db must not exist")
	fs.Var(diffFlag{&o}, "diff", "compare the outputs and state with this database (`DB`: the live one, or another replay's); "+
		"alone, with what was recorded: the recorded processor's replay of the same recordings")
	fs.IntVar(&o.DiffKeys, "diff-keys", recording.DefaultListed, "list up to `N` differing deliveries, and N differing rows per table "+
		"(every one is counted; 0: none listed)")
	fs.BoolVar(&o.JSON, "json", false, "print one JSON object")
	fs.BoolVar(&o.Verbose, "verbose", false, "show the replay loop's warnings on stderr")
	args = joinDiffValue(args)
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			helpOf(stdout, "replay", replaySynopsis, fs)
			fmt.Fprintln(stdout, "\nExit codes: 0 replayed (identical, with --diff), 1 divergent, 2 a bad usage, a bad recording or a replay that could not be made.")
			return o, 0, true
		case err != nil:
			return o, commandUsage(stderr, "replay", flagError(fs, err)), true
		}
		if fs.NArg() == 0 {
			break
		}
		o.Paths = append(o.Paths, fs.Arg(0)) // a recording; flags may follow it
		args = fs.Args()[1:]
	}
	if len(o.Paths) == 0 {
		return o, commandUsage(stderr, "replay", errors.New("name a recording (a .rec file, or a directory of them)")), true
	}
	if o.DiffKeys < 0 {
		return o, commandUsage(stderr, "replay", fmt.Errorf("--diff-keys %d: want 0 or more", o.DiffKeys)), true
	}
	if o.Config != "" && o.Processor != "" {
		return o, commandUsage(stderr, "replay", errors.New("--config and --processor: give one (the processor comes from the configuration)")), true
	}
	switch o.Processor {
	case "", forward.Name, ledger.Name, orders.Name:
	default:
		return o, commandUsage(stderr, "replay", fmt.Errorf("--processor %s: unknown processor (want forward, ledger or orders)", o.Processor)), true
	}
	return o, 0, false
}

// diffFlag is --diff: --diff DB (--diff=DB) compares with a database,
// --diff alone with what was recorded.
type diffFlag struct{ o *replayOptions }

func (f diffFlag) String() string   { return "" }
func (f diffFlag) IsBoolFlag() bool { return true }

func (f diffFlag) Set(s string) error {
	switch s {
	case "true":
		f.o.DiffRecorded, f.o.Diff = true, ""
	case "false", "":
		f.o.DiffRecorded, f.o.Diff = false, ""
	default:
		f.o.DiffRecorded, f.o.Diff = false, s
	}
	return nil
}

// joinDiffValue makes "--diff DB" one argument, "--diff=DB", when what
// follows --diff is not a flag nor a recording (a .rec file or a
// directory): --diff alone compares with the recording.
func joinDiffValue(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if (a == "--diff" || a == "-diff") && i+1 < len(args) && isDiffValue(args[i+1]) {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

func isDiffValue(s string) bool {
	if strings.HasPrefix(s, "-") || strings.HasSuffix(s, ".rec") {
		return false
	}
	st, err := os.Stat(s)
	return err != nil || !st.IsDir()
}

// replayReport is what the command prints.
type replayReport struct {
	Database string `json:"database"`
	// Restored names what the database was made from (the snapshot, or
	// --from; "" when it existed, or was made new).
	Restored  string            `json:"restored"`
	Processor replayProcessor   `json:"processor"`
	Files     []string          `json:"recordings"`
	Replay    recording.Summary `json:"replay"`
	DiffWith  string            `json:"diffWith,omitempty"`
	// Baseline is the recorded processor's replay, with --diff alone:
	// what the diff compares with.
	Baseline *baselineReport       `json:"baseline,omitempty"`
	Diff     *recording.DiffResult `json:"diff"`
	Verdict  string                `json:"verdict"`
	set      *recording.Set
}

// baselineReport is the recorded processor's replay that --diff alone
// compares with.
type baselineReport struct {
	Processor replayProcessor   `json:"processor"`
	Replay    recording.Summary `json:"replay"`
}

// replayProcessor says which processor replayed, against the recorded one.
type replayProcessor struct {
	Name string `json:"name"`
	// Kind is "sql" for a SQL processor (Version its version), "" for a
	// built-in or registered one.
	Kind                string `json:"kind,omitempty"`
	Version             int    `json:"version,omitempty"`
	Config              string `json:"config,omitempty"`
	Fingerprint         string `json:"fingerprint"`
	Recorded            string `json:"recorded"`
	RecordedFingerprint string `json:"recordedFingerprint"`
	RecordedBy          string `json:"recordedBy"`
	ReplayedBy          string `json:"replayedBy"`
}

func runReplay(ctx context.Context, o replayOptions, logger *slog.Logger) (*replayReport, error) {
	set, err := recording.Scan(o.Paths)
	if err != nil {
		return nil, err
	}
	h := set.Header()
	rep := &replayReport{set: set, DiffWith: o.Diff}
	for _, f := range set.Files {
		rep.Files = append(rep.Files, f.Path)
	}
	var proc ingest.Processor
	if o.Config != "" {
		proc, err = configProcessorOf(h, o.Config, o.opts, logger, &rep.Processor)
	} else {
		proc, err = replayProcessorOf(h, o.Processor, o.procs, logger, &rep.Processor)
	}
	if err != nil {
		return nil, err
	}
	out, cleanup, err := replayTarget(o.DB)
	if err != nil {
		return nil, err
	}
	_, serr := os.Stat(out)
	existed := o.DB != "" && serr == nil
	defer cleanup()
	rep.Database = out
	store, restored, err := recording.OpenTarget(ctx, set, out, o.From)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	rep.Restored = restored
	if rep.Processor.Kind == sqlproc.Kind {
		if err := sqlproc.Guard(ctx, store); err != nil {
			return nil, err
		}
	}
	rep.Replay, err = recording.Replay(ctx, recording.ReplayConfig{Set: set, Store: store, Processor: proc,
		ProcessorName: rep.Processor.Name, Logger: logger, KeepPlaces: o.Diff != "" || o.DiffRecorded})
	if err != nil && existed && errors.Is(err, recording.ErrBadSet) {
		return nil, existingTarget(ctx, store, set, out, err)
	}
	if err != nil {
		return nil, err
	}
	rep.Verdict = "replayed"
	switch {
	case o.DiffRecorded:
		base, done, err := rep.baseline(ctx, o, logger)
		if err != nil {
			return nil, err
		}
		defer done()
		rep.DiffWith = fmt.Sprintf("the recording (replayed with processor %s)", describeFingerprint(rep.Baseline.Processor))
		return rep, rep.diffWith(ctx, store, base, h.Feed, o.DiffKeys)
	case o.Diff != "":
		other, err := outbox.OpenExisting(ctx, o.Diff)
		if err != nil {
			return nil, fmt.Errorf("--diff: %w", err)
		}
		defer other.Close()
		return rep, rep.diffWith(ctx, store, other, h.Feed, o.DiffKeys)
	}
	return rep, nil
}

// baseline replays the recordings with the recorded processor, from the
// same start, into a temporary database: what was recorded, for --diff
// alone. done closes and removes it.
func (rep *replayReport) baseline(ctx context.Context, o replayOptions, logger *slog.Logger) (*outbox.Store, func(), error) {
	b := &baselineReport{}
	proc, err := replayProcessorOf(rep.set.Header(), "", o.procs, logger, &b.Processor)
	if err != nil {
		return nil, nil, fmt.Errorf("--diff compares with the recorded processor: %w; or give --diff DB", err)
	}
	out, cleanup, err := replayTarget("")
	if err != nil {
		return nil, nil, err
	}
	store, _, err := recording.OpenTarget(ctx, rep.set, out, o.From)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	done := func() { store.Close(); cleanup() }
	if b.Processor.Kind == sqlproc.Kind {
		if err := sqlproc.Guard(ctx, store); err != nil {
			done()
			return nil, nil, err
		}
	}
	b.Replay, err = recording.Replay(ctx, recording.ReplayConfig{Set: rep.set, Store: store, Processor: proc,
		ProcessorName: b.Processor.Name, Logger: logger})
	if err != nil {
		done()
		return nil, nil, fmt.Errorf("replay with the recorded processor: %w", err)
	}
	rep.Baseline = b
	return store, done, nil
}

// describeFingerprint names a processor with its fingerprint.
func describeFingerprint(p replayProcessor) string {
	return fmt.Sprintf("%s, fingerprint %s", p.Name, p.Fingerprint)
}

// existingTarget is the error of a replay into a database --db that
// exists already, standing where the recordings do not start (err): most
// often a replay of the same recordings, made before.
func existingTarget(ctx context.Context, store *outbox.Store, set *recording.Set, out string, err error) error {
	cps, rerr := store.ReadPositions(ctx, set.Header().Feed)
	if rerr != nil {
		return err
	}
	at := make([]string, len(cps))
	atEnd := len(cps) == len(set.End())
	for i, cp := range cps {
		at[i] = fmt.Sprintf("partition %d at %d", cp.Partition, cp.Position)
		end, ok := set.End()[cp.Partition]
		atEnd = atEnd && ok && end.Epoch == cp.Epoch && end.Position == cp.Position
	}
	where := fmt.Sprintf("standing at %s, where these recordings do not start", strings.Join(at, ", "))
	if atEnd {
		where = fmt.Sprintf("a replay that stands at the end of these recordings (%s: %s)", set.Header().Feed, strings.Join(at, ", "))
	}
	return fmt.Errorf("--db %s exists already, %s: give --db a path that does not exist (or remove %s) to replay them again, "+
		"or name only the recordings after it to go on from it", out, where, out)
}

func (rep *replayReport) diffWith(ctx context.Context, store, other *outbox.Store, feed string, listed int) error {
	res, err := recording.DiffListing(ctx, store, other, feed, rep.Replay.Places, listed)
	if err != nil {
		return err
	}
	rep.Diff = &res
	rep.Verdict = "identical"
	if !res.Identical {
		rep.Verdict = "divergent"
	}
	return nil
}

// replayProcessorOf builds the processor to replay with: name, or the
// recorded one, with the recorded configuration (a SQL processor's whole
// definition is in it).
func replayProcessorOf(h recording.Header, name string, procs *registry, logger *slog.Logger, info *replayProcessor) (ingest.Processor, error) {
	if name == "" {
		name = h.Processor
	}
	c := DefaultConfig()
	c.procs = procs
	if name == h.Processor && procs.check(name) != nil && h.ProcessorConfig[recordedKind] != sqlproc.Kind {
		return nil, fmt.Errorf("processor %s is neither built in nor registered, and the recording (made by %s) "+
			"keeps no SQL processor's definition: give --config FILE, the configuration the server ran", name, h.Outboxd)
	}
	fc, err := feedConfigOf(h, name, &c)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", recording.ErrBadRecord, err)
	}
	if name == orders.Name && h.Kind != ingest.KindKafka {
		return nil, fmt.Errorf("--processor orders: it reads a Kafka feed, and %s is a %s feed", h.Feed, h.Kind)
	}
	return buildReplayProcessor(h, fc, c, logger, info)
}

// configProcessorOf builds the processor the configuration file path
// gives the recorded feed, as a server started with it would.
func configProcessorOf(h recording.Header, path string, opts []Option, logger *slog.Logger, info *replayProcessor) (ingest.Processor, error) {
	c, err := ParseConfig([]string{"--config", path}, os.Getenv, opts...)
	if err != nil {
		return nil, err
	}
	fc, ok := c.Feeds[h.Feed]
	if !ok {
		return nil, fmt.Errorf("--config %s: no feed %s (the recording's); it has %s", path, h.Feed, strings.Join(c.FeedNames(), ", "))
	}
	if fc.Processor == "" {
		fc.Processor = h.Processor
	}
	info.Config = path
	return buildReplayProcessor(h, fc, c, logger, info)
}

func buildReplayProcessor(h recording.Header, fc *FeedConfig, c Config, logger *slog.Logger, info *replayProcessor) (ingest.Processor, error) {
	proc, err := newProcessor(h.Feed, h.Source, fc, c, logger)
	if err != nil {
		return nil, err
	}
	pc := processorConfig(fc, c)
	*info = replayProcessor{Name: fc.Processor, Fingerprint: recording.Fingerprint(fc.Processor, pc), Recorded: h.Processor,
		RecordedFingerprint: h.Fingerprint, RecordedBy: h.Outboxd, ReplayedBy: Version(), Config: info.Config}
	if pc[recordedKind] == sqlproc.Kind {
		info.Kind = sqlproc.Kind
		info.Version, _ = strconv.Atoi(pc[recordedVersion])
	}
	return proc, nil
}

// replayTarget is the database path to replay into: out, or a temporary
// one that cleanup removes.
func replayTarget(out string) (string, func(), error) {
	if out != "" {
		return out, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "outboxd-replay-*")
	if err != nil {
		return "", nil, err
	}
	return filepath.Join(dir, "replay.db"), func() { os.RemoveAll(dir) }, nil
}

// print writes the report as text.
func (rep *replayReport) print(w io.Writer) {
	s, p := rep.Replay, rep.Processor
	as := "as recorded"
	if p.Fingerprint != p.RecordedFingerprint {
		as = fmt.Sprintf("recorded: %s, fingerprint %s", p.Recorded, p.RecordedFingerprint)
	}
	fmt.Fprintf(w, "replayed feed %s with processor %s (fingerprint %s, %s) from %d recordings into %s\n",
		s.Feed, p.Name, p.Fingerprint, as, s.Recordings, rep.Database)
	if p.RecordedBy != p.ReplayedBy {
		fmt.Fprintf(w, "  recorded by outboxd %s, replayed by %s\n", p.RecordedBy, p.ReplayedBy)
	}
	if rep.Restored != "" {
		fmt.Fprintf(w, "  started from a copy of %s\n", rep.Restored)
	}
	fmt.Fprintf(w, "  %d items: %d applied, %d skipped as replays, %d dead-lettered, %d requeued, %d skipped by a completion failure; "+
		"%d retries; %d outputs; epochs started %d, losses %d\n",
		s.Items, s.Applied, s.ReplaysSkipped, s.DeadLettered, s.Requeued, s.Skipped, s.Retried, s.Outputs, s.EpochChanges, s.Losses)
	fmt.Fprintf(w, "  %.3fs, %.0f items/s\n", s.Seconds, s.PerSecond)
	if d := s.FirstDiffering; d != nil {
		fmt.Fprintf(w, "  decisions: %d differ from the recording; the first: sequence %d, %s[%d] epoch %s position %d: recorded %s, replayed %s\n",
			s.DecisionsDiffering, d.Sequence, s.Feed, d.Partition, d.Epoch, d.Position, d.Recorded, d.Replayed)
	} else {
		fmt.Fprintf(w, "  decisions: every item's outcome as recorded\n")
	}
	for _, t := range s.Torn {
		fmt.Fprintf(w, "  torn tail: %s: %d bytes from offset %d not read: %s\n", t.File, t.Bytes, t.Offset, t.Why)
	}
	for _, t := range s.Unconfirmed {
		fmt.Fprintf(w, "  unconfirmed: %s: %d bytes from offset %d not replayed: %s\n", t.File, t.Bytes, t.Offset, t.Why)
	}
	if rep.Diff != nil {
		rep.printDiff(w)
	}
}

func (rep *replayReport) printDiff(w io.Writer) {
	d := rep.Diff
	if d.Identical {
		fmt.Fprintf(w, "diff against %s: identical: %d deliveries, %d outputs", rep.DiffWith, d.Deliveries, d.OutputsReplayed)
		for _, t := range d.Tables {
			fmt.Fprintf(w, "; %s %d rows", t.Table, t.RowsReplayed)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "diff against %s: DIVERGENT: %d of %d deliveries differ (%d with no outputs in the database), %d of %d tables differ\n",
			rep.DiffWith, d.Divergent, d.Deliveries, d.MissingInDatabase, d.DivergentTables, len(d.Tables))
	}
	if d.Positions != "" {
		fmt.Fprintf(w, "  note: %s\n", d.Positions)
	}
	if len(d.Topics) > 0 {
		fmt.Fprintf(w, "  differing deliveries by topic:")
		for i, topic := range slices.Sorted(maps.Keys(d.Topics)) {
			if i > 0 {
				fmt.Fprint(w, ",")
			}
			fmt.Fprintf(w, " %s %d", cmp.Or(topic, "(no outputs)"), d.Topics[topic])
		}
		fmt.Fprintln(w)
	}
	if f := d.First; f != nil {
		fmt.Fprintf(w, "  first divergent delivery: %s[%d] epoch %s position %d\n", rep.Replay.Feed, f.Partition, f.Epoch, f.Position)
	}
	for _, f := range d.Divergences {
		fmt.Fprintf(w, "  delivery %s[%d] epoch %s position %d\n", rep.Replay.Feed, f.Partition, f.Epoch, f.Position)
		printOutputs(w, "expected", f.Expected)
		printOutputs(w, "got", f.Got)
	}
	if d.Unlisted > 0 {
		fmt.Fprintf(w, "  ... and %d more differing deliveries (--diff-keys)\n", d.Unlisted)
	}
	for _, t := range d.Tables {
		if !t.Same() {
			printTable(w, t)
		}
	}
}

func printOutputs(w io.Writer, label string, outs []recording.Output) {
	if len(outs) == 0 {
		fmt.Fprintf(w, "    %-8s (no outputs)\n", label)
	}
	for _, o := range outs {
		fmt.Fprintf(w, "    %-8s %s key %s value %s", label, o.Topic, quoted(o.Key), quoted(o.Value))
		for _, h := range o.Headers {
			fmt.Fprintf(w, " %s=%q", h[0], h[1])
		}
		fmt.Fprintln(w)
		label = ""
	}
}

func quoted(s *string) string {
	if s == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *s)
}

func printTable(w io.Writer, t recording.TableDiff) {
	switch {
	case t.Missing != "":
		fmt.Fprintf(w, "  table %s: missing in the %s\n", t.Table, t.Missing)
	case t.Columns != "":
		fmt.Fprintf(w, "  table %s: the columns differ: %s\n", t.Table, t.Columns)
	default:
		fmt.Fprintf(w, "  table %s: %d rows differ, %d only in the replay, %d only in the database; the first: %s\n",
			t.Table, t.Differing, t.OnlyReplayed, t.OnlyDatabase, t.FirstKey)
		for _, r := range t.Rows {
			fmt.Fprintf(w, "    row %s\n      expected %s\n      got      %s\n", r.Key, orNone(r.Expected), orNone(r.Got))
		}
		if t.Unlisted > 0 {
			fmt.Fprintf(w, "    ... and %d more differing rows (--diff-keys)\n", t.Unlisted)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "(no row)"
	}
	return s
}
