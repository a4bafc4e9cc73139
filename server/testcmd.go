package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// Exit codes of the test command.
const (
	// TestPassed: every test's outputs, dead letters and state are the
	// expected ones.
	TestPassed = 0
	// TestDiffers: at least one test got something else.
	TestDiffers = 1
	// TestUsage: a bad flag, test file or configuration.
	TestUsage = 2
)

const testSynopsis = "test FILE.test.yaml... [--run NAME] [--json]"

// Bounds of what a test reads: a test file (and an input file) in bytes,
// and the rows of a state table it compares.
const (
	maxTestFileBytes = 64 << 20
	maxTestStateRows = 100_000
)

// TestFile is a test file: a processor, and the tests run through it.
type TestFile struct {
	// Config is a configuration file (relative to the test file), whose
	// Feed's processor the tests run. Without it, Processor names a
	// built-in or registered processor, with Topic its outputs' topic.
	Config    string `yaml:"config"`
	Processor string `yaml:"processor"`
	Topic     string `yaml:"topic"`
	// Feed is the feed whose processor runs: the configuration's only
	// feed by default ("test" with Processor).
	Feed string `yaml:"feed"`
	// Kind is what the processor is told the feed is: file (the default:
	// an item per line, its position the byte after it) or kafka (its
	// position the item's offset plus one).
	Kind  string     `yaml:"kind"`
	Tests []TestCase `yaml:"tests"`

	dir string
}

// TestCase is one test: its input, and what must come of it. An
// expectation left out is not checked; an empty one (outputs: []) means
// none.
type TestCase struct {
	Name string `yaml:"name"`
	// Input is lines, one item each; InputFile a file of them (relative
	// to the test file); Items items with keys and headers; Recording a
	// recording (a .rec file or a directory), replayed from its snapshot.
	Input     string     `yaml:"input"`
	InputFile string     `yaml:"inputFile"`
	Items     []TestItem `yaml:"items"`
	Recording string     `yaml:"recording"`

	Outputs     *[]TestOutput          `yaml:"outputs"`
	DeadLetters *[]TestDeadLetter      `yaml:"deadLetters"`
	State       map[string][]yaml.Node `yaml:"state"`
}

// TestItem is an item of a test's input.
type TestItem struct {
	Key     *string           `yaml:"key"`
	Value   *string           `yaml:"value"`
	Headers map[string]string `yaml:"headers"`
}

// TestOutput is an expected output (the dead letters' topic apart): its
// topic, key (null when left out) and value, and, when given, its headers
// (only those named are compared).
type TestOutput struct {
	Topic   string            `yaml:"topic" json:"topic"`
	Key     *string           `yaml:"key" json:"key"`
	Value   *string           `yaml:"value" json:"value"`
	Headers map[string]string `yaml:"headers" json:"headers,omitempty"`
}

// TestDeadLetter is an expected dead letter: its item (Line, from 1, of
// the input; or its Position), its reason and, when given, its error.
type TestDeadLetter struct {
	Line     int     `yaml:"line"`
	Position int64   `yaml:"position"`
	Reason   string  `yaml:"reason"`
	Error    *string `yaml:"error"`
}

// testOptions are the test command's flags.
type testOptions struct {
	Run     string
	Verbose bool
	Files   []string
	opts    []Option
}

// testCommand runs test files and prints what differs.
func testCommand(ctx context.Context, args []string, stdout, stderr io.Writer, opts ...Option) int {
	o, code, done := parseTest(args, stdout, stderr)
	if done {
		return code
	}
	o.opts = opts
	if err := newOptions(opts).procs.err; err != nil {
		return badUsage(stderr, err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.Verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	passed, failed := 0, 0
	for _, path := range o.Files {
		tf, err := readTestFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "%s test: %s\n", programName, oneLine(err.Error()))
			return TestUsage
		}
		for _, tc := range tf.Tests {
			if o.Run != "" && !strings.Contains(tc.Name, o.Run) {
				continue
			}
			res, err := tf.run(ctx, tc, o.opts, logger)
			if err != nil {
				fmt.Fprintf(stderr, "%s test: %s: %s: %s\n", programName, path, tc.Name, oneLine(err.Error()))
				return TestUsage
			}
			if len(res.diffs) == 0 {
				passed++
				fmt.Fprintf(stdout, "ok   %s: %s (%s)\n", path, tc.Name, res.summary)
				continue
			}
			failed++
			fmt.Fprintf(stdout, "FAIL %s: %s (%s)\n", path, tc.Name, res.summary)
			for _, d := range res.diffs {
				fmt.Fprintf(stdout, "  %s\n", d)
			}
		}
	}
	fmt.Fprintf(stdout, "%d tests: %d passed, %d failed\n", passed+failed, passed, failed)
	switch {
	case passed+failed == 0:
		fmt.Fprintf(stderr, "%s test: no test ran (--run %q)\n", programName, o.Run)
		return TestUsage
	case failed > 0:
		return TestDiffers
	}
	return TestPassed
}

func parseTest(args []string, stdout, stderr io.Writer) (testOptions, int, bool) {
	var o testOptions
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.Run, "run", "", "run only the tests whose name holds `NAME`")
	fs.BoolVar(&o.Verbose, "verbose", false, "show the processor's loop warnings on stderr")
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			helpOf(stdout, "test", testSynopsis, fs)
			fmt.Fprintln(stdout, "\nExit codes: 0 every test passed, 1 a test got other outputs, dead letters or state, 2 a bad flag, test file or configuration.")
			return o, 0, true
		case err != nil:
			return o, commandUsage(stderr, "test", flagError(fs, err)), true
		}
		if fs.NArg() == 0 {
			break
		}
		o.Files = append(o.Files, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(o.Files) == 0 {
		return o, commandUsage(stderr, "test", errors.New("name a test file (FILE.test.yaml)")), true
	}
	return o, 0, false
}

// readTestFile reads and checks a test file: unknown keys and a test
// without input are mistakes.
func readTestFile(path string) (*TestFile, error) {
	b, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	tf := &TestFile{dir: filepath.Dir(path)}
	if err := dec.Decode(tf); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case tf.Config == "" && tf.Processor == "":
		return nil, fmt.Errorf("%s: give config (a configuration file) or processor (a built-in or registered one)", path)
	case tf.Config != "" && (tf.Processor != "" || tf.Topic != ""):
		return nil, fmt.Errorf("%s: config and processor (or topic): give one; the configuration names the processor", path)
	case tf.Kind != "" && tf.Kind != ingest.KindFile && tf.Kind != ingest.KindKafka:
		return nil, fmt.Errorf("%s: kind %q, want file or kafka", path, tf.Kind)
	case len(tf.Tests) == 0:
		return nil, fmt.Errorf("%s: no tests", path)
	}
	seen := map[string]bool{}
	for i, tc := range tf.Tests {
		name := cmp.Or(tc.Name, fmt.Sprintf("tests[%d]", i))
		inputs := 0
		for _, given := range []bool{tc.Input != "", tc.InputFile != "", len(tc.Items) > 0, tc.Recording != ""} {
			if given {
				inputs++
			}
		}
		switch {
		case tc.Name == "":
			return nil, fmt.Errorf("%s: %s: no name", path, name)
		case seen[tc.Name]:
			return nil, fmt.Errorf("%s: two tests named %q", path, tc.Name)
		case inputs != 1:
			return nil, fmt.Errorf("%s: %s: give one of input, inputFile, items or recording", path, name)
		}
		seen[tc.Name] = true
		for _, d := range deref(tc.DeadLetters) {
			if (d.Line > 0) == (d.Position > 0) {
				return nil, fmt.Errorf("%s: %s: a dead letter names its line (from 1) or its position, one of them", path, name)
			}
		}
	}
	return tf, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTestFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxTestFileBytes {
		return nil, fmt.Errorf("%s: over %d bytes", path, maxTestFileBytes)
	}
	return b, nil
}

func deref[T any](p *[]T) []T {
	if p == nil {
		return nil
	}
	return *p
}

// rel is path relative to the test file's directory.
func (tf *TestFile) rel(path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(tf.dir, path)
}

// processor builds the processor the tests run, as a server would, and
// the loop configuration it runs in.
func (tf *TestFile) processor(opts []Option, logger *slog.Logger) (ingest.Processor, ingest.Config, string, error) {
	var c Config
	var fc *FeedConfig
	name := tf.Feed
	if tf.Config != "" {
		var err error
		if c, err = ParseConfig([]string{"--config", tf.rel(tf.Config)}, func(string) string { return "" }, opts...); err != nil {
			return nil, ingest.Config{}, "", err
		}
		names := c.FeedNames()
		switch {
		case name == "" && len(names) == 1:
			name = names[0]
		case name == "":
			return nil, ingest.Config{}, "", fmt.Errorf("config %s has feeds %s: name one (feed: NAME)", tf.Config, strings.Join(names, ", "))
		}
		if fc = c.Feeds[name]; fc == nil {
			return nil, ingest.Config{}, "", fmt.Errorf("config %s has no feed %s", tf.Config, name)
		}
	} else {
		c = DefaultConfig()
		c.procs = newOptions(opts).procs
		name = cmp.Or(name, "test")
		fc = &FeedConfig{Source: cmp.Or(tf.Kind, ingest.KindFile) + ":test", Processor: tf.Processor, Topic: cmp.Or(tf.Topic, name+".out")}
	}
	kind, target, _ := strings.Cut(fc.Source, ":")
	if tf.Kind != "" {
		kind = tf.Kind
	}
	proc, err := newProcessor(name, target, fc, c, logger)
	if err != nil {
		return nil, ingest.Config{}, "", err
	}
	lc := ingest.DefaultConfig(name)
	lc.Processor = fc.Processor
	lc.BatchMax, lc.BatchBytes, lc.BatchWait = c.BatchMax, c.BatchBytes, 0
	lc.OnFailure = cmp.Or(fc.OnFailure, lc.OnFailure)
	lc.OnCompletionFailure = cmp.Or(fc.OnCompletionFailure, lc.OnCompletionFailure)
	lc.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, lc.MaxMessageBytes)
	lc.Retry.MinDelay, lc.Retry.MaxDelay = time.Millisecond, 10*time.Millisecond
	lc.CommitRetry.MinDelay, lc.CommitRetry.MaxDelay = time.Millisecond, 10*time.Millisecond
	lc.StallMaxDelay = 100 * time.Millisecond
	lc.Logger = logger
	return proc, lc, kind, nil
}

// testResult is what a test got, as the lines that differ.
type testResult struct {
	summary string
	diffs   []string
}

// run runs one test on a temporary database, removed after.
func (tf *TestFile) run(ctx context.Context, tc TestCase, opts []Option, logger *slog.Logger) (*testResult, error) {
	proc, lc, kind, err := tf.processor(opts, logger)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxd-test-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "test.db")
	var store *outbox.Store
	var set *recording.Set
	if tc.Recording != "" {
		if set, err = recording.Scan([]string{tf.rel(tc.Recording)}); err != nil {
			return nil, err
		}
		if set.Header().Feed != lc.Name {
			return nil, fmt.Errorf("recording %s is of feed %s, the test's processor runs feed %s (feed: NAME)", tc.Recording, set.Header().Feed, lc.Name)
		}
		store, _, err = recording.OpenTarget(ctx, set, path, "")
	} else {
		store, err = outbox.Open(ctx, outbox.DefaultConfig(path))
	}
	if err != nil {
		return nil, err
	}
	defer store.Close()
	if _, ok := proc.(*sqlproc.Processor); ok {
		if err := sqlproc.Guard(ctx, store); err != nil {
			return nil, err
		}
	}
	var lines []int64 // the position after each line, for dead letters by line
	if set != nil {
		_, err = recording.Replay(ctx, recording.ReplayConfig{Set: set, Store: store, Processor: proc, ProcessorName: lc.Processor, Logger: logger})
	} else {
		var recs []ingest.Record
		if recs, lines, err = tf.records(tc, kind); err != nil {
			return nil, err
		}
		err = runRecords(ctx, store, proc, lc, kind, recs)
	}
	if err != nil {
		return nil, err
	}
	return check(ctx, store, lc, tc, lines)
}

// testEpoch is the epoch of a test's items.
const testEpoch = "test"

// records is a test's input as a feed yields it: partition 0, epoch
// "test"; for a file, an item per line, its position the byte after it;
// for Kafka, its position the item's index plus one.
func (tf *TestFile) records(tc TestCase, kind string) ([]ingest.Record, []int64, error) {
	recs := []ingest.Record{{Kind: ingest.RecordEpoch, Epoch: testEpoch}}
	var lines []int64
	add := func(it ingest.Item, pos int64) {
		recs = append(recs, ingest.Record{Kind: ingest.RecordItem, Epoch: testEpoch, Position: pos, Item: it})
		lines = append(lines, pos)
	}
	if len(tc.Items) > 0 {
		for i, it := range tc.Items {
			item := ingest.Item{}
			if it.Key != nil {
				item.Key = []byte(*it.Key)
			}
			if it.Value != nil {
				item.Value = []byte(*it.Value)
			}
			for _, k := range sortedKeys(it.Headers) {
				item.Headers = append(item.Headers, outbox.Header{Key: k, Value: []byte(it.Headers[k])})
			}
			pos := int64(i + 1)
			if kind == ingest.KindFile {
				pos = lines0(lines) + int64(len(item.Value)) + 1
			}
			add(item, pos)
		}
		return recs, lines, nil
	}
	data := []byte(tc.Input)
	if tc.InputFile != "" {
		var err error
		if data, err = readBounded(tf.rel(tc.InputFile)); err != nil {
			return nil, nil, err
		}
	}
	pos := int64(0)
	for i, line := range bytes.SplitAfter(data, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		pos += int64(len(line))
		v := bytes.TrimSuffix(line, []byte("\n"))
		p := pos
		if kind == ingest.KindKafka {
			p = int64(i + 1)
		}
		add(ingest.Item{Value: slices.Clone(v)}, p)
	}
	return recs, lines, nil
}

func lines0(lines []int64) int64 {
	if len(lines) == 0 {
		return 0
	}
	return lines[len(lines)-1]
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// runRecords runs a real ingest loop over recs until the store stands
// after the last of them.
func runRecords(ctx context.Context, store *outbox.Store, proc ingest.Processor, lc ingest.Config, kind string, recs []ingest.Record) error {
	feed := &sliceFeed{kind: kind, recs: recs}
	loop, err := ingest.NewLoop(store, feed, proc, lc)
	if err != nil {
		return err
	}
	end := recs[len(recs)-1].Position
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- loop.Run(rctx) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("the processor's loop stopped: %w", cmp.Or(err, ctx.Err(), errors.New("early")))
		case <-ctx.Done():
			stop()
			<-errc
			return ctx.Err()
		case <-tick.C:
		}
		if st, why := loop.State(); st == outbox.StateStalled {
			stop()
			<-errc
			return fmt.Errorf("the processor's loop stalled: %s", why)
		}
		cps, err := store.ReadPositions(ctx, lc.Name)
		if err != nil {
			return err
		}
		if len(cps) == 1 && cps[0].Epoch == testEpoch && cps[0].Position == end {
			stop()
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}
	}
}

// sliceFeed is a Feed of the records of a test.
type sliceFeed struct {
	kind string
	recs []ingest.Record
	next int
}

func (f *sliceFeed) Kind() string   { return f.kind }
func (f *sliceFeed) Source() string { return "test" }
func (f *sliceFeed) Open(context.Context, map[int32]outbox.Checkpoint) error {
	return nil
}
func (f *sliceFeed) Commit(context.Context, []outbox.Checkpoint) error { return nil }
func (f *sliceFeed) Close() error                                      { return nil }
func (f *sliceFeed) Ends() map[int32]int64 {
	return map[int32]int64{0: f.recs[len(f.recs)-1].Position}
}

func (f *sliceFeed) Poll(ctx context.Context, buf []ingest.Record, limit int) ([]ingest.Record, error) {
	if len(buf) > 0 {
		return buf, nil
	}
	if f.next >= len(f.recs) {
		<-ctx.Done()
		return buf, ctx.Err()
	}
	for f.next < len(f.recs) && len(buf) < limit {
		r := f.recs[f.next]
		f.next++
		buf = append(buf, r)
		if r.Kind != ingest.RecordItem {
			break
		}
	}
	return buf, nil
}

// check compares what the test's store holds with what it expects.
func check(ctx context.Context, store *outbox.Store, lc ingest.Config, tc TestCase, lines []int64) (*testResult, error) {
	res := &testResult{}
	dlq := cmp.Or(lc.DeadLetterTopic, lc.Name+".dlq")
	var outs []outbox.Row
	for after := int64(0); ; {
		rows, err := store.Rows(ctx, after, 10_000)
		if err != nil {
			return nil, err
		}
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			if r.Topic != dlq {
				outs = append(outs, r)
			}
		}
		after = rows[len(rows)-1].ID
	}
	dls, err := store.DeadLetters(ctx, lc.Name, 0, 1_000_000)
	if err != nil {
		return nil, err
	}
	res.summary = fmt.Sprintf("%d outputs, %d dead letters", len(outs), len(dls))
	if tc.Outputs != nil {
		res.diffs = append(res.diffs, diffTestOutputs(*tc.Outputs, outs)...)
	}
	if tc.DeadLetters != nil {
		res.diffs = append(res.diffs, diffTestDeadLetters(*tc.DeadLetters, dls, lines)...)
	}
	for _, table := range slices.Sorted(mapKeys(tc.State)) {
		d, err := diffTestState(ctx, store, lc.Name, table, tc.State[table])
		if err != nil {
			return nil, err
		}
		res.diffs = append(res.diffs, d...)
	}
	return res, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func showTestOutput(o TestOutput) string {
	s := fmt.Sprintf("%s key %s value %s", o.Topic, quoted(o.Key), quoted(o.Value))
	for _, k := range sortedKeys(o.Headers) {
		s += fmt.Sprintf(" %s=%q", k, o.Headers[k])
	}
	return s
}

func diffTestOutputs(want []TestOutput, got []outbox.Row) []string {
	var diffs []string
	if len(want) != len(got) {
		diffs = append(diffs, fmt.Sprintf("outputs: %d expected, %d got", len(want), len(got)))
	}
	for i := range max(len(want), len(got)) {
		var g TestOutput
		if i < len(got) {
			r := got[i]
			g = TestOutput{Topic: r.Topic, Key: textOf(r.Key), Value: textOf(r.Value)}
			hs, _ := outbox.DecodeHeaders(r.Headers)
			if i < len(want) && want[i].Headers != nil {
				g.Headers = map[string]string{}
				for _, h := range hs {
					if _, ok := want[i].Headers[h.Key]; ok {
						g.Headers[h.Key] = string(h.Value)
					}
				}
			}
		}
		switch {
		case i >= len(want):
			diffs = append(diffs, fmt.Sprintf("outputs[%d]: unexpected %s (position %d)", i, showTestOutput(g), got[i].Position))
		case i >= len(got):
			diffs = append(diffs, fmt.Sprintf("outputs[%d]: missing  %s", i, showTestOutput(want[i])))
		case showTestOutput(want[i]) != showTestOutput(g):
			diffs = append(diffs, fmt.Sprintf("outputs[%d] (position %d):\n    expected %s\n    got      %s", i, got[i].Position,
				showTestOutput(want[i]), showTestOutput(g)))
		}
	}
	return diffs
}

func textOf(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func diffTestDeadLetters(want []TestDeadLetter, got []outbox.DeadLetter, lines []int64) []string {
	lineOf := map[int64]int{}
	for i, p := range lines {
		lineOf[p] = i + 1
	}
	show := func(d TestDeadLetter) string {
		at := fmt.Sprintf("position %d", d.Position)
		if d.Line > 0 {
			at = fmt.Sprintf("line %d", d.Line)
		}
		s := fmt.Sprintf("%s reason %s", at, d.Reason)
		if d.Error != nil {
			s += fmt.Sprintf(" error %q", *d.Error)
		}
		return s
	}
	var diffs []string
	if len(want) != len(got) {
		diffs = append(diffs, fmt.Sprintf("dead letters: %d expected, %d got", len(want), len(got)))
	}
	for i := range max(len(want), len(got)) {
		var g TestDeadLetter
		if i < len(got) {
			g = TestDeadLetter{Position: got[i].Position, Reason: got[i].Reason}
			if i < len(want) && want[i].Line > 0 {
				g.Line, g.Position = lineOf[got[i].Position], 0
			}
			if i < len(want) && want[i].Error != nil {
				g.Error = &got[i].Error
			}
		}
		switch {
		case i >= len(want):
			e := got[i].Error
			diffs = append(diffs, fmt.Sprintf("deadLetters[%d]: unexpected %s error %q", i, show(g), e))
		case i >= len(got):
			diffs = append(diffs, fmt.Sprintf("deadLetters[%d]: missing  %s", i, show(want[i])))
		case show(want[i]) != show(g):
			diffs = append(diffs, fmt.Sprintf("deadLetters[%d]:\n    expected %s\n    got      %s", i, show(want[i]), show(g)))
		}
	}
	return diffs
}

// diffTestState compares the rows of a state table (the feed's, when it
// has a feed column) with the expected ones, on the columns they name,
// values compared as text: rows missing and rows not expected.
func diffTestState(ctx context.Context, store *outbox.Store, feed, table string, want []yaml.Node) ([]string, error) {
	tables, err := store.StateTables(ctx)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(tables, func(t outbox.StateTable) bool { return t.Name == table })
	if i < 0 {
		return []string{fmt.Sprintf("state %s: no such table", table)}, nil
	}
	t := tables[i]
	var cols []string // the columns the expected rows name, in the table's order
	var wantRows []string
	for _, n := range want {
		var m map[string]any
		if err := n.Decode(&m); err != nil {
			return nil, fmt.Errorf("state %s: line %d: a row is a mapping of columns: %w", table, n.Line, err)
		}
		for k := range m {
			if !slices.Contains(t.Columns, k) {
				return nil, fmt.Errorf("state %s: line %d: no column %s (it has %s)", table, n.Line, k, strings.Join(t.Columns, ", "))
			}
			if !slices.Contains(cols, k) {
				cols = append(cols, k)
			}
		}
	}
	slices.SortFunc(cols, func(a, b string) int { return slices.Index(t.Columns, a) - slices.Index(t.Columns, b) })
	for _, n := range want {
		var m map[string]any
		n.Decode(&m)
		parts := make([]string, len(cols))
		for j, c := range cols {
			parts[j] = c + "=" + showTestValue(m[c])
		}
		wantRows = append(wantRows, strings.Join(parts, ", "))
	}
	c, err := store.StateRows(ctx, t, feed)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var gotRows []string
	for {
		row, ok := c.Next()
		if !ok {
			break
		}
		if len(gotRows) == maxTestStateRows {
			return nil, fmt.Errorf("state %s: over %d rows", table, maxTestStateRows)
		}
		parts := make([]string, len(cols))
		for j, col := range cols {
			parts[j] = col + "=" + showTestValue(row[slices.Index(t.Columns, col)])
		}
		gotRows = append(gotRows, strings.Join(parts, ", "))
	}
	if err := c.Err(); err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, r := range gotRows {
		count[r]++
	}
	var diffs []string
	for _, r := range wantRows {
		if count[r] > 0 {
			count[r]--
			continue
		}
		diffs = append(diffs, fmt.Sprintf("state %s: missing    row %s", table, r))
	}
	for _, r := range gotRows {
		if count[r] > 0 {
			count[r]--
			diffs = append(diffs, fmt.Sprintf("state %s: unexpected row %s", table, r))
		}
	}
	return diffs, nil
}

// showTestValue shows a value as the state comparison does: NULL as
// null, text and blobs as their bytes, numbers in decimal.
func showTestValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case []byte:
		return fmt.Sprintf("%q", x)
	case string:
		return fmt.Sprintf("%q", x)
	case time.Time:
		return fmt.Sprintf("%q", x.UTC().Format(time.RFC3339Nano))
	case float64:
		if x == float64(int64(x)) {
			return fmt.Sprintf("%d", int64(x))
		}
	}
	return fmt.Sprint(v)
}
