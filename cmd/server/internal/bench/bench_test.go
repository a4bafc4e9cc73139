package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/pierrec/lz4/v4"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/relay"
)

// TestMain lets the test binary be the bench's child broker: the bench
// starts its own executable as one.
// TestMain lets the test binary be the bench's children: it starts its own
// executable as the broker and as the server, "bench ARGS" with the child's
// variable set.
func TestMain(m *testing.M) {
	if os.Getenv(envBenchBroker) != "" || os.Getenv(envBenchServer) != "" {
		os.Exit(Command(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestBenchCommand(t *testing.T) {
	run := func(t *testing.T, args ...string) map[string]map[string]any {
		t.Helper()
		var stdout, stderr bytes.Buffer
		args = append(args, "--json", "--dir", t.TempDir())
		if code := Command(args, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(stdout.Bytes(), &fields); err != nil {
			t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout.String())
		}
		res := map[string]map[string]any{}
		for k, v := range fields {
			var obj map[string]any
			if k == "latency_curve" {
				var points []map[string]any
				if err := json.Unmarshal(v, &points); err != nil {
					t.Fatalf("latency_curve: %v", err)
				}
				obj = map[string]any{"points": points}
			} else if err := json.Unmarshal(v, &obj); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			res[k] = obj
		}
		return res
	}
	t.Run("OK", func(t *testing.T) {
		res := run(t, "--lines", "20000", "--latency-rates", "1000,2000", "--latency-duration", "1s")
		for _, phase := range []string{"read_floor", "commit_floor", "raw_sqlite", "naive_sqlite", "raw_produce", "raw_pipeline", "ingest", "end_to_end"} {
			if got := res[phase]["count"]; got != 20000.0 {
				t.Errorf("%s.count = %v, want 20000", phase, got)
			}
			if got, _ := res[phase]["per_second"].(float64); got <= 0 {
				t.Errorf("%s.per_second = %v, want more than 0", phase, res[phase]["per_second"])
			}
			cpu, _ := res[phase]["cpu"].(map[string]any)
			if got, _ := cpu["per_item_us"].(float64); got <= 0 {
				t.Errorf("%s.cpu.per_item_us = %v, want more than 0", phase, cpu["per_item_us"])
			}
		}
		// The relay's count is the rows after its first transaction.
		if got, _ := res["relay"]["count"].(float64); got <= 0 || got >= 20000 {
			t.Errorf("relay.count = %v, want in (0, 20000)", res["relay"]["count"])
		}
		for _, phase := range []string{"ingest", "relay", "end_to_end"} {
			if got, _ := res[phase]["peak_rss_mib"].(float64); got <= 0 {
				t.Errorf("%s.peak_rss_mib = %v, want the server's", phase, res[phase]["peak_rss_mib"])
			}
		}
		want := map[string]any{"ok": true, "outputs": 20000.0, "duplicates": 0.0, "missing": 0.0, "latency_duplicates": 0.0,
			"balances_checked": 1000.0}
		for k, v := range want {
			if res["verify"][k] != v {
				t.Errorf("verify.%s = %v, want %v (verify: %v)", k, res["verify"][k], v, res["verify"])
			}
		}
		// Without 10,000 lines/s in the curve, "latency" is its first point.
		if got := res["latency"]["lines"]; got != 1000.0 {
			t.Errorf("latency.lines = %v, want 1000", got)
		}
		points, _ := res["latency_curve"]["points"].([]map[string]any)
		if len(points) != 2 {
			t.Fatalf("latency_curve: %v, want 2 points", res["latency_curve"])
		}
		for i, rate := range []float64{1000, 2000} {
			p := points[i]
			if p["rate"] != rate || p["lines"] != rate {
				t.Errorf("latency_curve[%d]: rate %v, %v lines; want %v and %v", i, p["rate"], p["lines"], rate, rate)
			}
			for _, k := range []string{"p50_ms", "p99_ms", "max_ms", "achieved_rate", "p99_over_fdatasync"} {
				if v, _ := p[k].(float64); v <= 0 {
					t.Errorf("latency_curve[%d].%s = %v, want more than 0", i, k, p[k])
				}
			}
		}
		if got, _ := res["fdatasync"]["p99_ms"].(float64); got <= 0 || res["fdatasync"]["count"] != float64(fdatasyncProbes) {
			t.Errorf("fdatasync = %v, want %d probes and a p99", res["fdatasync"], fdatasyncProbes)
		}
		for _, k := range []string{"ingest_raw_sqlite", "relay_raw_produce", "end_to_end_ceiling", "ingest_raw_sqlite_cpu", "relay_raw_produce_cpu", "end_to_end_ceiling_cpu"} {
			if got, _ := res["ratios"][k].(float64); got <= 0 {
				t.Errorf("ratios.%s = %v, want more than 0", k, res["ratios"][k])
			}
		}
		if res["settings"]["synchronous"] != "full" || res["settings"]["processor"] != "ledger" || res["settings"]["go_version"] == "" {
			t.Errorf("settings = %v", res["settings"])
		}
		if got, _ := res["rss"]["peak_mib"].(float64); got <= 0 {
			t.Errorf("rss.peak_mib = %v", res["rss"]["peak_mib"])
		}
	})

	t.Run("Postgres", func(t *testing.T) {
		db := pgtest.New(t)
		if !strings.HasPrefix(db.DSN, "postgres://") {
			t.Skipf("--postgres takes a postgres:// URL; the server found is reached by %q", db.DSN)
		}
		res := run(t, "--lines", "20000", "--rate", "0", "--postgres", db.DSN)
		if got, _ := res["sink_postgres"]["count"].(float64); got <= 0 || got > 20000 {
			t.Errorf("sink_postgres.count = %v, want in (0, 20000]", res["sink_postgres"]["count"])
		}
		if got := res["sink_postgres_e2e"]["count"]; got != 20000.0 {
			t.Errorf("sink_postgres_e2e.count = %v, want 20000", got)
		}
		for _, phase := range []string{"sink_postgres", "sink_postgres_e2e"} {
			cpu, _ := res[phase]["cpu"].(map[string]any)
			if got, _ := cpu["per_item_us"].(float64); got <= 0 {
				t.Errorf("%s.cpu.per_item_us = %v, want more than 0", phase, cpu["per_item_us"])
			}
		}
		if res["verify"]["ok"] != true {
			t.Errorf("verify = %v", res["verify"])
		}
		// The tables are dropped after their phases.
		var n int
		if err := db.Conn(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'outboxd_bench' AND tablename LIKE 'sink_postgres%'`).Scan(&n); err != nil || n != 0 {
			t.Errorf("%d sink_postgres tables left (%v)", n, err)
		}
	})

	t.Run("Webhook", func(t *testing.T) {
		res := run(t, "--lines", "20000", "--rate", "0", "--webhook")
		if got := res["sink_webhook"]["count"]; got != 20000.0 {
			t.Errorf("sink_webhook.count = %v, want 20000", got)
		}
		cpu, _ := res["sink_webhook"]["cpu"].(map[string]any)
		if got, _ := cpu["per_item_us"].(float64); got <= 0 {
			t.Errorf("sink_webhook.cpu.per_item_us = %v, want more than 0", cpu["per_item_us"])
		}
		if res["verify"]["ok"] != true {
			t.Errorf("verify = %v", res["verify"])
		}
	})

	t.Run("Record", func(t *testing.T) {
		res := run(t, "--lines", "20000", "--rate", "0", "--record")
		for _, phase := range []string{"ingest", "ingest_recorded", "replay"} {
			if got := res[phase]["count"]; got != 20000.0 {
				t.Errorf("%s.count = %v, want 20000", phase, got)
			}
			cpu, _ := res[phase]["cpu"].(map[string]any)
			if got, _ := cpu["per_item_us"].(float64); got <= 0 {
				t.Errorf("%s.cpu.per_item_us = %v, want more than 0", phase, cpu["per_item_us"])
			}
		}
		want := map[string]any{"verdict": "identical", "identical": true, "applied": 20000.0, "dead_lettered": 0.0,
			"replays_skipped": 0.0, "outputs": 20000.0, "decisions_differing": 0.0, "torn_tails": 0.0, "unconfirmed": 0.0,
			"deliveries": 20000.0, "outputs_compared": 20000.0, "tables_compared": 1.0, "rows_compared": 1000.0}
		for k, v := range want {
			if res["replay"][k] != v {
				t.Errorf("replay.%s = %v, want %v (replay: %v)", k, res["replay"][k], v, res["replay"])
			}
		}
		rec := res["recording"]
		if rec["files"] != 1.0 || bytesOf(rec, "bytes") < 20000*20 || bytesOf(rec, "snapshot_bytes") <= 0 {
			t.Errorf("recording = %v, want one file of at least 20 bytes a line and a snapshot", rec)
		}
		for _, k := range []string{"ingest_recorded_ingest", "ingest_recorded_ingest_cpu"} {
			if got, _ := res["ratios"][k].(float64); got <= 0 {
				t.Errorf("ratios.%s = %v, want more than 0", k, res["ratios"][k])
			}
		}
		if res["settings"]["record"] != true || res["verify"]["ok"] != true || res["verify"]["failures"] != nil {
			t.Errorf("settings %v, verify %v", res["settings"], res["verify"])
		}
	})

	t.Run("Forward", func(t *testing.T) {
		res := run(t, "--processor", "forward", "--line-bytes", "300", "--line-fill", "random", "--lines", "5000", "--rate", "0")
		if got := res["settings"]["file_bytes"]; got != 5000*300.0 {
			t.Errorf("settings.file_bytes = %v, want %d", got, 5000*300)
		}
		if got := res["settings"]["line_fill"]; got != "random" {
			t.Errorf("settings.line_fill = %v, want random", got)
		}
		want := map[string]any{"ok": true, "outputs": 5000.0, "duplicates": 0.0, "missing": 0.0, "balances_checked": 0.0}
		for k, v := range want {
			if res["verify"][k] != v {
				t.Errorf("verify.%s = %v, want %v (verify: %v)", k, res["verify"][k], v, res["verify"])
			}
		}
	})

	t.Run("Sweep", func(t *testing.T) {
		chart := filepath.Join(t.TempDir(), "sweep.svg")
		res := run(t, "--sweep", "accounts", "--sweep-sizes", "10,3000", "--lines", "4000", "--chart", chart)
		var sweep struct {
			Points []struct {
				Accounts  int
				Ingest    struct{ Count int64 }
				RawSQLite struct{ Count int64 } `json:"raw_sqlite"`
			}
		}
		b, _ := json.Marshal(res["sweep"])
		if err := json.Unmarshal(b, &sweep); err != nil || len(sweep.Points) != 2 {
			t.Fatalf("sweep = %s (%v)", b, err)
		}
		for i, want := range []int{10, 3000} {
			p := sweep.Points[i]
			if p.Accounts != want || p.Ingest.Count != 4000 || p.RawSQLite.Count != 4000 {
				t.Errorf("point %d = %+v, want %d accounts, 4000 lines each", i, p, want)
			}
		}
		svg, err := os.ReadFile(chart)
		if err != nil || !bytes.Contains(svg, []byte("<svg")) {
			t.Errorf("chart: %v, %.80q", err, svg)
		}
		if res["verify"]["failures"] != nil {
			t.Errorf("verify = %v", res["verify"])
		}
	})

	t.Run("Orders", func(t *testing.T) {
		res := run(t, "--processor", "orders", "--accounts", "50", "--lines", "3000")
		if got := res["ingest"]["count"]; got != 3000.0 {
			t.Errorf("ingest.count = %v, want 3000 events", got)
		}
		if res["verify"]["failures"] != nil {
			t.Errorf("verify = %v", res["verify"])
		}
	})

	t.Run("ErrBadFlag", func(t *testing.T) {
		for _, args := range [][]string{{"--lines", "0"}, {"--no-such-flag"}, {"--synchronous", "off"}, {"--relay-batch", "0"},
			{"extra"}, {"--processor", "sql"}, {"--line-bytes", "-1"}, {"--sweep", "lines"}, {"--chart", "x.svg"},
			{"--sweep", "accounts", "--processor", "forward"}, {"--sweep-sizes", "10,x"},
			{"--record", "--sweep", "accounts"}, {"--record", "--processor", "orders"},
			{"--line-fill", "zeros"}, {"--line-fill", "random", "--line-bytes", "100"}} {
			var stdout, stderr bytes.Buffer
			if code := Command(args, &stdout, &stderr); code != 2 {
				t.Errorf("%v: exit %d, want 2", args, code)
			}
			if lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n"); len(lines) != 1 || lines[0] == "" {
				t.Errorf("%v: stderr is not one line: %q", args, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("%v: stdout: %q", args, stdout.String())
			}
		}
	})
}

// TestCheckReplay shows the --record phase's check fails on each way a
// replay can differ from its recorded run.
func TestCheckReplay(t *testing.T) {
	const lines = 100
	good := func() replayReport {
		return replayReport{Verdict: "identical",
			Replay: recording.Summary{Items: lines, Applied: lines - 3, DeadLettered: 3, Outputs: lines},
			Diff: &recording.DiffResult{Identical: true, Deliveries: lines, OutputsReplayed: lines, OutputsDatabase: lines,
				Tables: []recording.TableDiff{{Table: "ledger_balances", RowsReplayed: 7, RowsDatabase: 7}}}}
	}
	var v verifyResult
	checkReplay(good(), lines, &v)
	if len(v.Failures) != 0 {
		t.Fatalf("a replay identical to its run: %v", v.Failures)
	}
	for name, mutate := range map[string]func(r *replayReport){
		"Divergent": func(r *replayReport) {
			r.Verdict, r.Diff.Identical, r.Diff.Divergent = "divergent", false, 1
			r.Diff.First = &recording.Divergence{Epoch: "e", Position: 42}
		},
		"NoDiff":        func(r *replayReport) { r.Diff = nil },
		"FewerItems":    func(r *replayReport) { r.Replay.Items, r.Replay.Applied = lines-1, lines-4 },
		"Replays":       func(r *replayReport) { r.Replay.ReplaysSkipped = 1 },
		"FewerOutputs":  func(r *replayReport) { r.Replay.Outputs = lines - 1 },
		"Decisions":     func(r *replayReport) { r.Replay.DecisionsDiffering = 2 },
		"Torn":          func(r *replayReport) { r.Replay.Torn = []recording.TailReport{{File: "x.rec"}} },
		"Unconfirmed":   func(r *replayReport) { r.Replay.Unconfirmed = []recording.TailReport{{File: "x.rec"}} },
		"FewerCompared": func(r *replayReport) { r.Diff.Deliveries, r.Diff.OutputsDatabase = lines-1, lines-1 },
	} {
		t.Run(name, func(t *testing.T) {
			r := good()
			mutate(&r)
			var v verifyResult
			checkReplay(r, lines, &v)
			if len(v.Failures) != 1 {
				t.Fatalf("failures %q, want one", v.Failures)
			}
		})
	}
	r := good()
	r.Verdict, r.Diff.Identical, r.Diff.Divergent = "divergent", false, 1
	r.Diff.First = &recording.Divergence{Epoch: "e", Position: 42}
	checkReplay(r, lines, &v)
	if len(v.Failures) != 1 || !strings.Contains(v.Failures[0], "position 42") {
		t.Errorf("divergent: %q, want the first divergent position named", v.Failures)
	}
}

func TestLexOrder(t *testing.T) {
	for _, n := range []int{0, 1, 2, 9, 10, 11, 99, 100, 101, 1000, 12345} {
		var got []string
		lexOrder(n, func(i int) error { got = append(got, accountName(i)); return nil })
		want := make([]string, n)
		for i := range want {
			want[i] = accountName(i)
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("lexOrder(%d) = %v, want %v", n, got[:min(len(got), 12)], want[:min(n, 12)])
		}
	}
}

// TestPipelineBatch: raw_pipeline commits what raw_sqlite wrote in
// --batch-wait, never more than --batch-max nor less than one line.
func TestPipelineBatch(t *testing.T) {
	for _, c := range []struct {
		perSecond float64
		wait      time.Duration
		want      int64
	}{
		{1_000_000, 5 * time.Millisecond, 5000},
		{136_108, 5 * time.Millisecond, 680},
		{10_000_000, 5 * time.Millisecond, 16000},
		{10, 5 * time.Millisecond, 1},
		{1_000_000, 0, 16000},
		{0, 5 * time.Millisecond, 16000},
	} {
		b := &bench{o: benchOptions{BatchMax: 16000, BatchWait: c.wait}, res: &benchResult{}}
		if c.perSecond > 0 {
			b.res.RawSQLite = &phaseResult{PerSecond: c.perSecond}
		}
		if got := b.pipelineBatch(); got != c.want {
			t.Errorf("raw_sqlite %.0f lines/s, --batch-wait %s: pipeline batch %d, want %d", c.perSecond, c.wait, got, c.want)
		}
	}
	b := &bench{o: benchOptions{BatchMax: 16000, BatchWait: 5 * time.Millisecond}, res: &benchResult{}}
	if got := b.pipelineBatch(); got != 16000 {
		t.Errorf("raw_sqlite not run: pipeline batch %d, want 16000", got)
	}
}

// TestLineGen_Fill: padded lines have exactly the length asked for, the
// same text on every generator, "acct-N,AMOUNT" first; the random fill
// leaves LZ4 nothing to compress, the spaces nearly everything.
func TestLineGen_Fill(t *testing.T) {
	for _, fill := range []string{fillSpaces, fillRandom} {
		a, b := newLineGen(100, 1024, fill), newLineGen(100, 1024, fill)
		var all []byte
		for range 200 {
			l, text := a.next()
			_, again := b.next()
			if len(text) != 1024 || !bytes.Equal(text, again) || text[1023] != '\n' {
				t.Fatalf("%s: line %d: %d bytes, same on a second generator: %v", fill, l.Index, len(text), bytes.Equal(text, again))
			}
			if want := fmt.Sprintf("%s,%d ", accountName(l.Account), l.Amount); !bytes.HasPrefix(text, []byte(want)) {
				t.Fatalf("%s: line %q does not start with %q", fill, text[:40], want)
			}
			all = append(all, text...)
		}
		z := make([]byte, lz4.CompressBlockBound(len(all)))
		n, err := lz4.CompressBlock(all, z, nil)
		if err != nil {
			t.Fatal(err)
		}
		ratio := float64(n) / float64(len(all))
		if (fill == fillRandom && ratio < 0.7) || (fill == fillSpaces && ratio > 0.1) {
			t.Errorf("%s: LZ4 makes the lines %.2f of their size", fill, ratio)
		}
	}
}

// TestBenchOutputCheck shows the smoke test's check fails on each kind of wrong
// output.
func TestBenchOutputCheck(t *testing.T) {
	d, err := writeLines(context.Background(), filepath.Join(t.TempDir(), "l.csv"), 200, 7, 0, fillSpaces)
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, mutate func(recs []*kafka.Record) []*kafka.Record) verifyResult {
		t.Helper()
		c := newOutputCheck(d, "ledger")
		for _, r := range mutate(ledgerRecords(d)) {
			c.add(r, time.Now())
		}
		v := verifyResult{Enabled: true}
		c.verify(d, &v)
		return v
	}
	t.Run("OK", func(t *testing.T) {
		v := check(t, func(recs []*kafka.Record) []*kafka.Record { return recs })
		if len(v.Failures) != 0 || v.Outputs != 200 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		v := check(t, func(recs []*kafka.Record) []*kafka.Record { return append(recs, recs[3]) })
		if v.Duplicates != 1 || len(v.Failures) == 0 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("ErrMissing", func(t *testing.T) {
		v := check(t, func(recs []*kafka.Record) []*kafka.Record { return recs[1:] })
		if v.Missing != 1 || len(v.Failures) == 0 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("ErrBalance", func(t *testing.T) {
		v := check(t, func(recs []*kafka.Record) []*kafka.Record {
			recs[len(recs)-1].Value = []byte(`{"balance":1234567}`)
			return recs
		})
		if len(v.Failures) != 1 || !strings.Contains(v.Failures[0], "1234567") {
			t.Fatalf("%+v", v)
		}
	})
}

// ledgerRecords are the records a correct run publishes for d.
func ledgerRecords(d lineData) []*kafka.Record {
	g, bal := d.gen(), make([]int64, d.Accounts)
	var recs []*kafka.Record
	for range d.Lines {
		l, _ := g.next()
		bal[l.Account] += l.Amount
		name := accountName(l.Account)
		v, _ := json.Marshal(ledger.Output{Account: name, Amount: l.Amount, Balance: bal[l.Account], Position: l.Position})
		recs = append(recs, &kafka.Record{Key: []byte(name), Value: v,
			Headers: []*sarama.RecordHeader{{Key: []byte(relay.HeaderPosition), Value: []byte(strconv.FormatInt(l.Position, 10))}}})
	}
	return recs
}

func TestServerEnv(t *testing.T) {
	got := serverEnv([]string{"PATH=/bin", "OUTBOXD_FEED=x=file:/y", "GOGC=100", "OUTBOXD_BATCH_MAX=5"})
	if want := []string{"PATH=/bin", "GOGC=100"}; !slices.Equal(got, want) {
		t.Errorf("serverEnv = %v, want %v", got, want)
	}
}

// bytesOf is the number m holds at k, 0 when it holds none.
func bytesOf(m map[string]any, k string) float64 {
	f, _ := m[k].(float64)
	return f
}
