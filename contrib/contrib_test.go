// Package contrib_test checks the Grafana dashboard and the Prometheus
// alerts beside it against the metrics a running outboxd exports, and
// validates them with promtool.
package contrib_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/server"
)

var (
	scrapeOnce sync.Once
	families   map[string]*dto.MetricFamily
	scrapeErr  error
)

// exported runs outboxd in-process once (a ledger file feed with a dead
// letter, the relay on the dev broker, a Kafka feed reading the ledger's
// outputs) and returns the metric families of its /metrics.
func exported(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	scrapeOnce.Do(func() { families, scrapeErr = runAndScrape() })
	if scrapeErr != nil {
		t.Fatal(scrapeErr)
	}
	return families
}

func runAndScrape() (map[string]*dto.MetricFamily, error) {
	dir, err := os.MkdirTemp("", "outboxd-contrib")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	input := filepath.Join(dir, "ledger.csv")
	if err := os.WriteFile(input, []byte("acct-1,10\nnot a ledger line\nacct-2,5\n"), 0o644); err != nil {
		return nil, err
	}
	cfg, err := server.ParseConfig([]string{"--db", filepath.Join(dir, "outboxd.db"), "--http", "127.0.0.1:0",
		"--feed", "ledger=file:" + input, "--processor", "ledger=ledger", "--feed", "copy=kafka:ledger.out",
		"--dev-broker-addr", "127.0.0.1:0", "--dev-broker-data", ""}, func(string) string { return "" })
	if err != nil {
		return nil, err
	}
	m := server.NewMain(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-m.Ready():
	case err := <-done:
		return nil, fmt.Errorf("outboxd stopped before it served: %v", err)
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("outboxd not ready within 60s")
	}
	// Both outputs of the ledger read back by the Kafka feed: every family
	// has samples (partitions, relay errors, dead letters by reason).
	if err := poll(60*time.Second, func() error {
		var st struct{ Applied int64 }
		if err := getJSON(m.URL()+"/feeds/copy/status", &st); err != nil {
			return err
		}
		if st.Applied != 2 {
			return fmt.Errorf("the copy feed applied %d, want 2", st.Applied)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	res, err := http.Get(m.URL() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(res.Body)
}

func getJSON(url string, v any) error {
	res, err := http.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return json.NewDecoder(res.Body).Decode(v)
}

func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dashboardQueries returns every PromQL query of the Grafana dashboard,
// by the panel (or variable) it belongs to.
func dashboardQueries(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("grafana/outboxd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name       string
				Type       string
				Definition string
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/outboxd.json: %v", err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out["panel "+p.Title] = append(out["panel "+p.Title], tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			out["variable "+v.Name] = append(out["variable "+v.Name], v.Definition)
		}
	}
	return out
}

// alertQueries returns the expression of every alert of alerts.yaml.
func alertQueries(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	out := map[string][]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = append(out["alert "+r.Alert], r.Expr)
		}
	}
	return out
}

var (
	metricName = regexp.MustCompile(`\boutboxd_[a-z0-9_]+\b`)
	selector   = regexp.MustCompile(`\b(outboxd_[a-z0-9_]+)\s*\{([^}]*)\}`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	grouping   = regexp.MustCompile(`\b(?:by|on|without|ignoring)\s*\(([^)]*)\)`)
	// scrapeUp is Prometheus's own up metric of a scrape: what an alert
	// on a target that is down reads.
	scrapeUp = regexp.MustCompile(`\bup\{job="outboxd"\}`)
)

// family is the exported family a name in a query reads (a histogram's
// _bucket, _sum and _count read the histogram), nil when none.
func family(mfs map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if mf, ok := mfs[name]; ok {
		return mf
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if mf, ok := mfs[strings.TrimSuffix(name, suf)]; ok && strings.HasSuffix(name, suf) && mf.GetType() == dto.MetricType_HISTOGRAM {
			return mf
		}
	}
	return nil
}

// labels are the label names a family's samples carry (le for histograms).
func labels(mf *dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			out[lp.GetName()] = true
		}
	}
	if mf.GetType() == dto.MetricType_HISTOGRAM {
		out["le"] = true
	}
	return out
}

// checkQueries checks that each query reads metrics outboxd exports, with
// samples, selects and groups by labels they have.
func checkQueries(t *testing.T, mfs map[string]*dto.MetricFamily, queries map[string][]string) {
	t.Helper()
	// Labels a scrape adds, and those of the ALERTS it makes.
	scrapeLabels := map[string]bool{"instance": true, "job": true}
	for where, exprs := range queries {
		for _, expr := range exprs {
			names := metricName.FindAllString(expr, -1)
			if len(names) == 0 && !scrapeUp.MatchString(expr) {
				t.Errorf("%s: %q reads no outboxd metric", where, expr)
			}
			known := map[string]bool{}
			for k := range scrapeLabels {
				known[k] = true
			}
			for _, n := range names {
				mf := family(mfs, n)
				if mf == nil || len(mf.GetMetric()) == 0 {
					t.Errorf("%s: %s is not exported (in %q)", where, n, expr)
					continue
				}
				for l := range labels(mf) {
					known[l] = true
				}
			}
			for _, sel := range selector.FindAllStringSubmatch(expr, -1) {
				mf := family(mfs, sel[1])
				if mf == nil {
					continue
				}
				have := labels(mf)
				for _, m := range matcher.FindAllStringSubmatch(sel[2], -1) {
					if !have[m[1]] && !scrapeLabels[m[1]] {
						t.Errorf("%s: %s has no label %s (in %q)", where, sel[1], m[1], expr)
					}
				}
			}
			for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					if l = strings.TrimSpace(l); l != "" && !known[l] {
						t.Errorf("%s: groups by %s, a label none of its metrics has (in %q)", where, l, expr)
					}
				}
			}
		}
	}
}

// TestGrafana_QueriesExported: every query of the dashboard reads metrics
// a running outboxd exports, by labels they have.
func TestGrafana_QueriesExported(t *testing.T) {
	qs := dashboardQueries(t)
	for _, want := range []string{"outboxd_feed_applied_total", "outboxd_feed_lag_bytes", "outboxd_feed_lag_records", "outboxd_outbox_pending",
		"outboxd_relay_published_total", "outboxd_relay_errors_total", "outboxd_feed_dead_letters_total", "outboxd_feed_losses_total"} {
		found := false
		for _, exprs := range qs {
			for _, e := range exprs {
				found = found || strings.Contains(e, want)
			}
		}
		if !found {
			t.Errorf("the dashboard shows no %s", want)
		}
	}
	checkQueries(t, exported(t), qs)
}

// TestAlerts_QueriesExported: every alert reads metrics a running outboxd
// exports.
func TestAlerts_QueriesExported(t *testing.T) {
	qs := alertQueries(t)
	for _, want := range []string{"OutboxdFeedStalled", "OutboxdFeedNotLossless", "OutboxdRelayRefusing",
		"OutboxdRelayBackingOff", "OutboxdBacklogGrowing", "OutboxdDeadLettersRising", "OutboxdBackpressure",
		"OutboxdOldestPendingOutput", "OutboxdDown"} {
		if _, ok := qs["alert "+want]; !ok {
			t.Errorf("no alert %s", want)
		}
	}
	checkQueries(t, exported(t), qs)
}

// promtool returns promtool's path, skipping the test without it (CI
// installs Debian's prometheus package, which has it).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but promtool is missing: %v", err)
		}
		t.Skip("no promtool: apt-get install prometheus to validate the alerts and the dashboard's queries")
	}
	return p
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}

// TestAlerts_Promtool: the rules are valid and each alert fires when its
// unit tests say (alerts_test.yaml), and not otherwise.
func TestAlerts_Promtool(t *testing.T) {
	p := promtool(t)
	run(t, p, "check", "rules", "prometheus/alerts.yaml")
	run(t, p, "test", "rules", "prometheus/alerts_test.yaml")
}

// TestGrafana_Promtool: every query of the dashboard is valid PromQL, with
// its Grafana variables given values.
func TestGrafana_Promtool(t *testing.T) {
	p := promtool(t)
	vars := strings.NewReplacer("$__rate_interval", "5m", "${feed}", ".*", "$feed", ".*", "$instance", ".*")
	var b bytes.Buffer
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for where, exprs := range dashboardQueries(t) {
		if strings.HasPrefix(where, "variable ") {
			continue // label_values() is Grafana's, not PromQL
		}
		for _, e := range exprs {
			n++
			q, _ := json.Marshal(vars.Replace(e))
			fmt.Fprintf(&b, "      - record: dashboard:query%d\n        expr: %s\n", n, q)
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, p, "check", "rules", path)
}

// TestGrafana_Instance: the dashboard has an instance variable and every
// query of a panel keeps to the instances it selects.
func TestGrafana_Instance(t *testing.T) {
	qs := dashboardQueries(t)
	if _, ok := qs["variable instance"]; !ok {
		t.Fatal("no instance variable")
	}
	sel := regexp.MustCompile(`\boutboxd_[a-z0-9_]+\{([^}]*)\}`)
	for where, exprs := range qs {
		if where == "variable instance" {
			continue
		}
		for _, e := range exprs {
			names := metricName.FindAllString(e, -1)
			sels := sel.FindAllStringSubmatch(e, -1)
			if len(sels) != len(names) {
				t.Errorf("%s: %q reads a metric without a selector", where, e)
			}
			for _, s := range sels {
				if !strings.Contains(s[1], `instance=~"$instance"`) {
					t.Errorf("%s: %q does not keep to $instance", where, e)
				}
			}
		}
	}
}

// unitOf is the unit a metric's name says: seconds, bytes, records (a
// Kafka feed's offsets, relay transactions' rows), or "" for a count or a
// state.
func unitOf(name string) string {
	for _, u := range []string{"seconds", "bytes", "records"} {
		if strings.Contains(name, "_"+u) {
			return u
		}
	}
	return ""
}

// TestGrafana_NoPanelMixesUnits: within a panel every query's metrics
// have one unit (no seconds beside records), and it is the panel's.
func TestGrafana_NoPanelMixesUnits(t *testing.T) {
	grafanaUnit := map[string]string{"seconds": "s", "bytes": "bytes"}
	b, err := os.ReadFile("grafana/outboxd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title, Type string
			FieldConfig struct{ Defaults struct{ Unit string } }
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Panels {
		units := map[string]bool{}
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				if strings.HasSuffix(n, "_count") {
					continue // a histogram's count: events, whatever the histogram measures
				}
				units[unitOf(n)] = true
			}
		}
		if len(units) > 1 {
			t.Errorf("panel %q mixes units %v", p.Title, units)
		}
		for u := range units {
			if want, ok := grafanaUnit[u]; ok && p.FieldConfig.Defaults.Unit != want {
				t.Errorf("panel %q shows %s in unit %q, want %q", p.Title, u, p.FieldConfig.Defaults.Unit, want)
			}
		}
	}
}

// systemdAnalyze returns systemd-analyze's path, skipping the test without
// it (CI's Debian has it with systemd).
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but systemd-analyze is missing: %v", err)
		}
		t.Skip("no systemd-analyze: apt-get install systemd to verify the unit")
	}
	return p
}

// TestSystemd_Unit: the unit passes systemd-analyze verify, and its
// sandboxing keeps systemd's exposure score at most 2.0 (of 10: "OK"). The
// binary it starts is this test's own, standing in for outboxd at the
// unit's path (verify checks it is executable).
func TestSystemd_Unit(t *testing.T) {
	sa := systemdAnalyze(t)
	b, err := os.ReadFile("systemd/outboxd.service")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "ExecStart=/usr/local/bin/outboxd ") {
		t.Fatal("the unit does not start /usr/local/bin/outboxd")
	}
	for _, want := range []string{"NoNewPrivileges=yes", "ProtectSystem=strict", "DynamicUser=yes", "CapabilityBoundingSet=\n",
		"RestartPreventExitStatus=2 3", "SystemCallFilter=@system-service"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	unit := filepath.Join(t.TempDir(), "outboxd.service")
	if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/outboxd", self)), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, sa, "verify", "--man=no", unit)
	run(t, sa, "security", "--offline=yes", "--threshold=20", unit)
}
