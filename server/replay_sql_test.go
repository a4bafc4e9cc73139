package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/recording"
)

// recordSQL runs the SQL processor "balances" over data with --record and
// returns the configuration file, the database and the recordings.
func recordSQL(t *testing.T, data string) (yml, db, rec string) {
	t.Helper()
	dir := t.TempDir()
	input := filepath.Join(dir, "in.csv")
	db, rec = filepath.Join(dir, "outboxd.db"), filepath.Join(dir, "rec")
	if err := os.WriteFile(input, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	yml = writeYAML(t, balancesYAML(input, ""))
	r := runMain(t, "--config", yml, "--db", db, "--relay", "none", "--http", "127.0.0.1:0", "--record", rec)
	r.ready(t)
	wait(t, 30*time.Second, func() error {
		if got := feedPosition(t, r.m.Store, "payments"); got != int64(len(data)) {
			return fmt.Errorf("stored position %d, want %d", got, len(data))
		}
		return nil
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	return yml, db, rec
}

const sqlData = "alice,10\nbob,5\nalice,-3\nnot a line\ncarol,4\n"

// TestReplay_SQLProcessor: a SQL processor's recording replays from the
// definition its header keeps, or from --config, identical to the live
// database; the header holds the SQL text and the version.
func TestReplay_SQLProcessor(t *testing.T) {
	yml, db, rec := recordSQL(t, sqlData)
	set, err := recording.Scan([]string{rec})
	if err != nil {
		t.Fatal(err)
	}
	h := set.Header()
	if h.Processor != "balances" || h.ProcessorConfig["kind"] != "sql" || h.ProcessorConfig["version"] != "1" ||
		!strings.Contains(h.ProcessorConfig["definition"], `"apply":"INSERT INTO balances VALUES (:account, :amount)\n  ON CONFLICT(account)`) {
		t.Fatalf("header processor %s config %q", h.Processor, h.ProcessorConfig)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"FromHeader", nil},
		{"FromConfig", []string{"--config", yml}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, code := replayJSON(t, append([]string{rec, "--diff", db}, tc.args...)...)
			if code != ReplayIdentical || rep.Verdict != "identical" || rep.Replay.Items != 5 || rep.Replay.Applied != 4 ||
				rep.Replay.DeadLettered != 1 || rep.Replay.DecisionsDiffering != 0 || rep.Diff.Deliveries != 5 ||
				rep.Diff.OutputsDatabase != 5 || rep.Processor.Kind != "sql" || rep.Processor.Version != 1 ||
				rep.Processor.Fingerprint != h.Fingerprint || rep.Processor.RecordedFingerprint != h.Fingerprint {
				t.Fatalf("exit %d, report %+v, replay %+v, diff %+v", code, rep.Processor, rep.Replay, rep.Diff)
			}
		})
	}
	t.Run("ChangedSQL", func(t *testing.T) {
		// Another version of the SQL: another fingerprint, said so.
		b, _ := os.ReadFile(yml)
		changed := writeYAML(t, strings.Replace(string(b), "'balance', balance,", "'balance', balance * 2,", 1))
		rep, code := replayJSON(t, rec, "--config", changed, "--diff", db)
		if code != ReplayDivergent || rep.Processor.Fingerprint == h.Fingerprint || rep.Processor.RecordedFingerprint != h.Fingerprint ||
			rep.Diff.Divergent != 4 || rep.Diff.DivergentTables != 0 {
			t.Fatalf("exit %d, processor %+v, diff %+v", code, rep.Processor, rep.Diff)
		}
	})
	t.Run("NoSuchFeed", func(t *testing.T) {
		other := writeYAML(t, strings.Replace(balancesYAML("/x.csv", ""), "  payments:", "  other:", 1))
		var stdout, stderr bytes.Buffer
		code := replayCommand(context.Background(), []string{rec, "--config", other}, &stdout, &stderr)
		want := "server replay: --config " + other + ": no feed payments (the recording's); it has other\n"
		if code != ReplayFailed || stderr.String() != want {
			t.Fatalf("exit %d, stderr %q, want 2 and %q", code, stderr.String(), want)
		}
	})
}

// TestFingerprint_SQLVersions: two versions of a SQL processor (another
// statement, another version) fingerprint differently; the same one the
// same.
func TestFingerprint_SQLVersions(t *testing.T) {
	fp := func(yml string) string {
		c, err := ParseConfig([]string{"--config", writeYAML(t, yml)}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		fc := c.Feeds["payments"]
		return recording.Fingerprint(fc.Processor, processorConfig(fc, c))
	}
	base := balancesYAML("/in.csv", "")
	a, again := fp(base), fp(base)
	emit := fp(strings.Replace(base, "'balance', balance,", "'balance', balance * 2,", 1))
	reject := fp(strings.Replace(base, "typeof(:amount) <> 'integer'", "typeof(:amount) <> 'integer' OR :amount = 0", 1))
	if a != again || a == emit || a == reject || emit == reject {
		t.Fatalf("fingerprints: base %s, again %s, emit changed %s, reject changed %s", a, again, emit, reject)
	}
}

// TestReplay_OldSQLRecording: a recording of a SQL processor made before
// the definition was recorded is refused in one line naming why, and
// replays with --config.
func TestReplay_OldSQLRecording(t *testing.T) {
	yml, db, rec := recordSQL(t, sqlData)
	files, _ := filepath.Glob(filepath.Join(rec, "*.rec"))
	if len(files) != 1 {
		t.Fatalf("recordings %q", files)
	}
	stripDefinition(t, files[0])
	var stdout, stderr bytes.Buffer
	code := replayCommand(context.Background(), []string{rec}, &stdout, &stderr)
	want := "server replay: processor balances is neither built in nor registered, and the recording " +
		"(made by " + Version() + ") keeps no SQL processor's definition: give --config FILE, the configuration the server ran\n"
	if code != ReplayFailed || stderr.String() != want {
		t.Fatalf("exit %d, stderr %q\nwant %q", code, stderr.String(), want)
	}
	rep, code := replayJSON(t, rec, "--config", yml, "--diff", db)
	if code != ReplayIdentical || rep.Diff.Deliveries != 5 || rep.Processor.Fingerprint == rep.Processor.RecordedFingerprint {
		t.Fatalf("exit %d, processor %+v, diff %+v", code, rep.Processor, rep.Diff)
	}
}

// stripDefinition rewrites the recording at path as an outboxd before
// SQL definitions were recorded wrote it: its header's processor
// configuration only the topic.
func stripDefinition(t *testing.T, path string) {
	t.Helper()
	r, err := recording.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	h := r.Header()
	var txns []recording.Txn
	for {
		txn, err := r.Next()
		if err != nil {
			break
		}
		txns = append(txns, txn)
	}
	r.Close()
	h.ProcessorConfig = map[string]string{"topic": h.ProcessorConfig["topic"]}
	h.Fingerprint = recording.Fingerprint(h.Processor, h.ProcessorConfig)
	os.Remove(path)
	w, err := recording.Create(path, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, txn := range txns {
		for _, e := range txn.Entries {
			if e.Record.Kind == ingest.RecordItem {
				w.Item(e.Record, e.Delivery, e.Outcome)
			} else {
				w.Control(e.Record)
			}
		}
		if err := w.Prepare(txn.Checkpoints); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.End(h.Part); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReplay_DiffRecorded: --config new.yaml --diff alone replays the
// recordings with the new SQL and with the recorded one, and lists every
// delivery and every state row that differ, with counts per table and
// topic, in JSON and in text; --diff-keys bounds the listing, never the
// counts.
func TestReplay_DiffRecorded(t *testing.T) {
	data := sqlData + "bob,-1\n"
	yml, _, rec := recordSQL(t, data)
	t.Run("Same", func(t *testing.T) {
		rep, code := replayJSON(t, rec, "--diff")
		if code != ReplayIdentical || !rep.Diff.Identical || rep.Diff.Deliveries != 6 || rep.Baseline == nil ||
			rep.Baseline.Replay.Items != 6 || len(rep.Diff.Divergences) != 0 {
			t.Fatalf("exit %d, diff %+v", code, rep.Diff)
		}
	})
	b, _ := os.ReadFile(yml)
	// The new version refuses negative amounts.
	changed := writeYAML(t, strings.Replace(string(b), "typeof(:amount) <> 'integer'", "typeof(:amount) <> 'integer' OR :amount < 0", 1))
	rep, code := replayJSON(t, rec, "--config", changed, "--diff")
	d := rep.Diff
	if code != ReplayDivergent || rep.Verdict != "divergent" || d.Deliveries != 6 || d.Divergent != 2 || len(d.Divergences) != 2 ||
		d.DivergentTables != 1 || rep.Replay.DecisionsDiffering != 2 || d.Topics["payments.out"] != 2 || d.Topics["payments.dlq"] != 2 ||
		len(d.Topics) != 2 || d.Unlisted != 0 {
		t.Fatalf("exit %d, replay %+v, diff %+v", code, rep.Replay, d)
	}
	for i, pos := range []int64{24, 50} {
		dv := d.Divergences[i]
		if dv.Position != pos || len(dv.Expected) != 1 || dv.Expected[0].Topic != "payments.out" || len(dv.Got) != 1 || dv.Got[0].Topic != "payments.dlq" {
			t.Fatalf("divergence %d: %+v, want position %d, expected on payments.out, got on payments.dlq", i, dv, pos)
		}
	}
	tb := d.Tables[0]
	wantRows := []recording.RowDiff{
		{Key: `account="alice"`, Expected: `account="alice", balance=7`, Got: `account="alice", balance=10`},
		{Key: `account="bob"`, Expected: `account="bob", balance=4`, Got: `account="bob", balance=5`},
	}
	if tb.Table != "balances" || tb.Differing != 2 || tb.OnlyReplayed != 0 || tb.OnlyDatabase != 0 || tb.RowsReplayed != 3 ||
		fmt.Sprint(tb.Rows) != fmt.Sprint(wantRows) {
		t.Fatalf("table %+v\nwant rows %+v", tb, wantRows)
	}
	t.Run("Text", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		code := replayCommand(context.Background(), []string{rec, "--config", changed, "--diff"}, &stdout, &stderr)
		out := stdout.String()
		for _, want := range []string{
			"diff against the recording (replayed with processor balances, fingerprint " + rep.Baseline.Processor.Fingerprint +
				"): DIVERGENT: 2 of 6 deliveries differ (0 with no outputs in the database), 1 of 2 tables differ\n",
			"  differing deliveries by topic: payments.dlq 2, payments.out 2\n",
			"  table balances: 2 rows differ, 0 only in the replay, 0 only in the database; the first: account=\"alice\"\n" +
				"    row account=\"alice\"\n      expected account=\"alice\", balance=7\n      got      account=\"alice\", balance=10\n" +
				"    row account=\"bob\"\n      expected account=\"bob\", balance=4\n      got      account=\"bob\", balance=5\n",
		} {
			if !strings.Contains(out, want) {
				t.Fatalf("exit %d, stdout\n%s\nwant it to hold\n%s", code, out, want)
			}
		}
		if code != ReplayDivergent || strings.Count(out, "  delivery payments[0] epoch ") != 2 {
			t.Fatalf("exit %d, stdout\n%s", code, out)
		}
	})
	t.Run("Listed", func(t *testing.T) {
		rep, code := replayJSON(t, rec, "--config", changed, "--diff", "--diff-keys", "1")
		d := rep.Diff
		if code != ReplayDivergent || d.Divergent != 2 || len(d.Divergences) != 1 || d.Unlisted != 1 ||
			d.Tables[0].Differing != 2 || len(d.Tables[0].Rows) != 1 || d.Tables[0].Unlisted != 1 {
			t.Fatalf("exit %d, diff %+v", code, d)
		}
	})
	t.Run("BadKeys", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := replayCommand(context.Background(), []string{rec, "--diff-keys", "-1"}, &stdout, &stderr); code != ReplayFailed ||
			!strings.Contains(stderr.String(), "--diff-keys -1: want 0 or more") || strings.Count(stderr.String(), "\n") != 1 {
			t.Fatalf("exit %d, stderr %q", code, stderr.String())
		}
	})
}
