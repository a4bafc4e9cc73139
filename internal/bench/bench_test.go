package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/server"
)

// TestMain lets the test binary be the bench's child broker: the bench
// starts its own executable as one.
func TestMain(m *testing.M) {
	if os.Getenv(envBenchBroker) != "" {
		os.Exit(benchBrokerChild(os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestBenchCommand(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		args := []string{"--lines", "20000", "--json", "--rate", "2000", "--latency-duration", "1s", "--dir", t.TempDir(), "--record"}
		if code := Command(args, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
		}
		var res map[string]map[string]any
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout.String())
		}
		for _, phase := range []string{"raw_sqlite", "raw_produce", "ingest", "ingest_recorded", "replay", "relay", "end_to_end"} {
			if got := res[phase]["count"]; got != 20000.0 {
				t.Errorf("%s.count = %v, want 20000", phase, got)
			}
			if got, _ := res[phase]["per_second"].(float64); got <= 0 {
				t.Errorf("%s.per_second = %v, want more than 0", phase, res[phase]["per_second"])
			}
		}
		if r := res["replay"]; r["identical"] != true || r["deliveries"] != 20000.0 || r["outputs"] != 20000.0 || r["recording_bytes"].(float64) <= 0 {
			t.Errorf("replay = %v, want identical over 20000 deliveries and outputs", r)
		}
		for _, phase := range []string{"ingest", "ingest_recorded"} {
			if got, _ := res[phase]["cpu_us_per_item"].(float64); got <= 0 {
				t.Errorf("%s.cpu_us_per_item = %v, want more than 0", phase, res[phase]["cpu_us_per_item"])
			}
		}
		want := map[string]any{"ok": true, "outputs": 20000.0, "duplicates": 0.0, "missing": 0.0, "latency_duplicates": 0.0}
		for k, v := range want {
			if res["verify"][k] != v {
				t.Errorf("verify.%s = %v, want %v (verify: %v)", k, res["verify"][k], v, res["verify"])
			}
		}
		if got := res["latency"]["lines"]; got != 2000.0 {
			t.Errorf("latency.lines = %v, want 2000", got)
		}
		for _, k := range []string{"p50_ms", "p99_ms", "max_ms"} {
			if _, ok := res["latency"][k].(float64); !ok {
				t.Errorf("latency.%s missing: %v", k, res["latency"])
			}
		}
		for _, k := range []string{"ingest_raw_sqlite", "relay_raw_produce"} {
			if got, _ := res["ratios"][k].(float64); got <= 0 {
				t.Errorf("ratios.%s = %v, want more than 0", k, res["ratios"][k])
			}
		}
		if res["settings"]["synchronous"] != "full" || res["settings"]["go_version"] == "" {
			t.Errorf("settings = %v", res["settings"])
		}
		for _, k := range []string{"relay_drain_max_mib", "relay_drain_first_half_max_mib", "relay_drain_second_half_max_mib"} {
			if got, _ := res["rss"][k].(float64); got <= 0 {
				t.Errorf("rss.%s = %v, want more than 0", k, res["rss"][k])
			}
		}
		if got, _ := res["settings"]["gogc"].(float64); got != float64(server.DefaultGOGC) && os.Getenv("GOGC") == "" {
			t.Errorf("settings.gogc = %v, want %d", res["settings"]["gogc"], server.DefaultGOGC)
		}
	})

	t.Run("HalfMaxima", func(t *testing.T) {
		for _, c := range []struct {
			samples       []float64
			first, second float64
		}{
			{nil, 0, 0},
			{[]float64{5}, 0, 5},
			{[]float64{3, 9, 4, 4}, 9, 4},
			{[]float64{3, 4, 8, 2, 7}, 4, 8},
		} {
			if f, s := halfMaxima(c.samples); f != c.first || s != c.second {
				t.Errorf("halfMaxima(%v) = %v, %v, want %v, %v", c.samples, f, s, c.first, c.second)
			}
		}
	})

	t.Run("ErrBadFlag", func(t *testing.T) {
		for _, args := range [][]string{{"--lines", "0"}, {"--no-such-flag"}, {"--synchronous", "off"}, {"--relay-batch", "0"}, {"extra"}} {
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

// TestBenchOutputCheck shows the smoke test's check fails on each kind of wrong
// output.
func TestBenchOutputCheck(t *testing.T) {
	d, err := writeLedger(context.Background(), filepath.Join(t.TempDir(), "l.csv"), 200, 7)
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, mutate func(recs []*kgo.Record) []*kgo.Record) verifyResult {
		t.Helper()
		c := newOutputCheck(d)
		for _, r := range mutate(ledgerRecords(d)) {
			c.add(r, time.Now())
		}
		v := verifyResult{Enabled: true}
		c.verify(d, &v)
		return v
	}
	t.Run("OK", func(t *testing.T) {
		v := check(t, func(recs []*kgo.Record) []*kgo.Record { return recs })
		if len(v.Failures) != 0 || v.Outputs != 200 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		v := check(t, func(recs []*kgo.Record) []*kgo.Record { return append(recs, recs[3]) })
		if v.Duplicates != 1 || len(v.Failures) == 0 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("ErrMissing", func(t *testing.T) {
		v := check(t, func(recs []*kgo.Record) []*kgo.Record { return recs[1:] })
		if v.Missing != 1 || len(v.Failures) == 0 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("ErrBalance", func(t *testing.T) {
		v := check(t, func(recs []*kgo.Record) []*kgo.Record {
			recs[len(recs)-1].Value = []byte(`{"balance":1234567}`)
			return recs
		})
		if len(v.Failures) != 1 || !strings.Contains(v.Failures[0], "1234567") {
			t.Fatalf("%+v", v)
		}
	})
}

// ledgerRecords are the records a correct run publishes for d.
func ledgerRecords(d ledgerData) []*kgo.Record {
	g, bal := newLedgerGen(d.Names), make([]int64, len(d.Names))
	var recs []*kgo.Record
	for range d.Lines {
		l, _ := g.next()
		bal[l.Account] += l.Amount
		v, _ := json.Marshal(ledger.Output{Account: d.Names[l.Account], Amount: l.Amount, Balance: bal[l.Account], Position: l.Position})
		recs = append(recs, &kgo.Record{Key: []byte(d.Names[l.Account]), Value: v,
			Headers: []kgo.RecordHeader{{Key: relay.HeaderPosition, Value: []byte(strconv.FormatInt(l.Position, 10))}}})
	}
	return recs
}
