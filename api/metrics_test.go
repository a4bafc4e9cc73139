package api_test

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/outbox"
)

// scrape GETs /metrics and parses it with the Prometheus text parser.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, hdr, b := request(t, base, http.MethodGet, "/metrics", "", nil)
	if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d %q: %s", code, hdr.Get("Content-Type"), b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// value returns the value of the family's sample whose labels include
// labels (name, value pairs).
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	for _, m := range mf.GetMetric() {
		if hasLabels(m, labels) {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue()
			}
			t.Fatalf("metric %s is a %v", name, mf.GetType())
		}
	}
	t.Fatalf("metric %s has no sample with labels %v", name, labels)
	return 0
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func b01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func TestMetrics_EqualStatus(t *testing.T) {
	h := newHarness(t, api.DefaultConfig())
	h.script()
	h.srv.Metrics().ObserveBatch(feedName, 7, 3*time.Millisecond)
	h.srv.Metrics().ObserveRelayTxn(20*time.Millisecond, 5)

	var fs api.FeedStatus
	h.getJSON("/feeds/ledger/status", &fs)
	var ostat api.OutboxStatus
	h.getJSON("/outbox/status", &ostat)
	mfs := scrape(t, h.ts.URL)

	f := []string{"feed", feedName}
	for name, want := range map[string]float64{
		api.MetricFeedApplied:            float64(fs.Applied),
		api.MetricFeedReplaysSkipped:     float64(fs.ReplaysSkipped),
		api.MetricFeedRetries:            float64(fs.Retries),
		api.MetricFeedCompletionFailures: float64(fs.CompletionFailures),
		api.MetricFeedEpochChanges:       float64(fs.EpochChanges),
		api.MetricFeedLosses:             float64(len(fs.Losses)),
		api.MetricFeedLossless:           b01(fs.Lossless),
		api.MetricFeedLastApplied:        float64(fs.LastAppliedAt.Unix()),
		api.MetricFeedOutboxPending:      float64(fs.Outbox.Pending),
		api.MetricFeedOutboxOldestAge:    fs.Outbox.OldestPendingAge,
	} {
		if got := value(t, mfs, name, f...); got != want {
			t.Errorf("%s = %v, status says %v", name, got, want)
		}
	}
	if len(fs.Partitions) != 1 {
		t.Fatalf("partitions %+v, want one", fs.Partitions)
	}
	for _, p := range fs.Partitions {
		pl := []string{"feed", feedName, "partition", fmt.Sprint(p.Partition)}
		for name, want := range map[string]int64{api.MetricFeedPositionBytes: p.Position, api.MetricFeedEndBytes: p.End, api.MetricFeedLagBytes: p.Lag} {
			if got := value(t, mfs, name, pl...); got != float64(want) || len(mfs[name].GetMetric()) != len(fs.Partitions) {
				t.Errorf("%s%v = %v of %d samples, status says %d", name, pl, got, len(mfs[name].GetMetric()), want)
			}
		}
	}
	var page api.DeadLetterPage
	h.getJSON("/feeds/ledger/dead-letters", &page)
	byReason := map[string]float64{}
	for _, dl := range page.DeadLetters {
		byReason[dl.Reason]++
	}
	if len(byReason) == 0 || len(mfs[api.MetricFeedDeadLetters].GetMetric()) != len(byReason) {
		t.Errorf("%s has %d samples, the feed's dead letters %d reasons", api.MetricFeedDeadLetters,
			len(mfs[api.MetricFeedDeadLetters].GetMetric()), len(byReason))
	}
	for reason, want := range byReason {
		if got := value(t, mfs, api.MetricFeedDeadLetters, "feed", feedName, "reason", reason); got != want {
			t.Errorf("%s{reason=%s} = %v, the API lists %v", api.MetricFeedDeadLetters, reason, got, want)
		}
	}
	if h.store.Postgres() {
		// No WAL file of outboxd's: the gauge stays 0.
		if got := value(t, mfs, api.MetricSQLiteWALBytes); got != 0 {
			t.Errorf("%s = %v on PostgreSQL, want 0", api.MetricSQLiteWALBytes, got)
		}
	} else if wal, err := os.Stat(h.store.Path() + "-wal"); err != nil || value(t, mfs, api.MetricSQLiteWALBytes) != float64(wal.Size()) {
		t.Errorf("%s = %v, the file: %v (%v)", api.MetricSQLiteWALBytes, value(t, mfs, api.MetricSQLiteWALBytes), wal, err)
	}
	// The scripted values, so the comparison above is not of zeros.
	if value(t, mfs, api.MetricFeedApplied, f...) != 4 || value(t, mfs, api.MetricFeedLossless, f...) != 0 ||
		value(t, mfs, api.MetricFeedCompletionFailures, f...) != 1 {
		t.Errorf("metrics are not the scripted values")
	}
	for _, st := range []string{"running", "caught-up", "waiting", "stalled", "failed", "stopped"} {
		if got, want := value(t, mfs, api.MetricFeedState, "feed", feedName, "state", st), b01(st == string(fs.State)); got != want {
			t.Errorf("%s{state=%s} = %v, want %v", api.MetricFeedState, st, got, want)
		}
	}
	for name, want := range map[string]float64{
		api.MetricOutboxPending:         float64(ostat.Pending),
		api.MetricOutboxOldestAge:       ostat.OldestPendingAge,
		api.MetricOutboxLastPublishedID: float64(ostat.LastPublishedID),
		api.MetricOutboxLastID:          float64(ostat.LastOutboxID),
		api.MetricRelayPublished:        float64(ostat.Published),
		api.MetricRelayConnected:        b01(ostat.Relay.Connected),
		api.MetricRelayFenced:           b01(ostat.Relay.Fenced),
	} {
		if got := value(t, mfs, name); got != want {
			t.Errorf("%s = %v, status says %v", name, got, want)
		}
	}
	if n := len(mfs[api.MetricRelayState].GetMetric()); n != len(api.RelayStates) {
		t.Errorf("%s has %d series, want one per state (%d)", api.MetricRelayState, n, len(api.RelayStates))
	}
	for _, st := range api.RelayStates {
		if got, want := value(t, mfs, api.MetricRelayState, "mode", "none", "state", st), b01(st == "off"); got != want {
			t.Errorf("%s{mode=none,state=%s} = %v, want %v", api.MetricRelayState, st, got, want)
		}
	}
	// A file feed's partition gauges are in bytes only.
	for _, name := range []string{api.MetricFeedPositionRecords, api.MetricFeedEndRecords, api.MetricFeedLagRecords, "outboxd_feed_dead_lettered_total"} {
		if _, ok := mfs[name]; ok {
			t.Errorf("%s is exported for a file feed", name)
		}
	}
	if bi := mfs[api.MetricBuildInfo].GetMetric(); len(bi) != 1 || bi[0].GetGauge().GetValue() != 1 || !hasLabels(bi[0], []string{"goversion", runtime.Version()}) {
		t.Errorf("%s = %v, want 1 with the Go version", api.MetricBuildInfo, bi)
	}

	hist := func(name string, labels ...string) *dto.Histogram {
		t.Helper()
		mf, ok := mfs[name]
		if !ok || mf.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("histogram %s missing", name)
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				return m.GetHistogram()
			}
		}
		t.Fatalf("histogram %s has no sample with labels %v", name, labels)
		return nil
	}
	for _, c := range []struct {
		h     *dto.Histogram
		count uint64
		sum   float64
	}{
		{hist(api.MetricIngestBatchItems, f...), 1, 7},
		{hist(api.MetricIngestCommitSeconds, f...), 1, 0.003},
		{hist(api.MetricRelayTxnSeconds), 1, 0.02},
		{hist(api.MetricRelayTxnRecords), 1, 5},
	} {
		if c.h.GetSampleCount() != c.count || math.Abs(c.h.GetSampleSum()-c.sum) > 1e-9 {
			t.Errorf("histogram count %d sum %v, want %d and %v", c.h.GetSampleCount(), c.h.GetSampleSum(), c.count, c.sum)
		}
	}
	if _, ok := mfs["go_goroutines"]; !ok {
		t.Error("the Go collector is missing")
	}
}

// TestMetrics_Relay: with a relay, its counters and state are exported as
// the outbox status shows them.
func TestMetrics_Relay(t *testing.T) {
	s := openStore(t)
	r := &fakeRelay{}
	r.set(api.RelayStatus{Mode: "exactly-once", State: "idle", Connected: true, LastPublishedID: 0, PublishedTotal: 42,
		Errors: map[string]int64{"retryable": 3, "ambiguous": 0, "fenced": 0, "fatal": 1}})
	srv, err := api.New(api.DefaultConfig(), s, nil, r, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, srv)
	mfs := scrape(t, ts)
	if v := value(t, mfs, api.MetricRelayPublished); v != 42 {
		t.Errorf("%s = %v, want 42", api.MetricRelayPublished, v)
	}
	if v := value(t, mfs, api.MetricRelayConnected); v != 1 {
		t.Errorf("%s = %v, want 1", api.MetricRelayConnected, v)
	}
	if v := value(t, mfs, api.MetricRelayState, "mode", "exactly-once", "state", "idle"); v != 1 {
		t.Errorf("%s = %v, want 1", api.MetricRelayState, v)
	}
	for class, want := range map[string]float64{"retryable": 3, "ambiguous": 0, "fenced": 0, "fatal": 1} {
		if v := value(t, mfs, api.MetricRelayErrors, "class", class); v != want {
			t.Errorf("%s{class=%s} = %v, want %v", api.MetricRelayErrors, class, v, want)
		}
	}
	var m *api.Metrics // nil: the hooks do nothing
	m.ObserveBatch("x", 1, time.Second)
	m.ObserveRelayTxn(time.Second, 1)
	m.ObserveCheckpoint(outbox.CheckpointResult{})
}

// TestMetrics_Buckets: the size histograms' buckets reach the configured
// maxima, so a full batch is counted in a bucket of its own size.
func TestMetrics_Buckets(t *testing.T) {
	if got := fmt.Sprint(api.SizeBuckets(4000)); got != "[1 2 4 8 16 32 64 128 256 512 1024 2048 4000]" {
		t.Fatalf("SizeBuckets(4000) = %s", got)
	}
	if got := fmt.Sprint(api.SizeBuckets(1)); got != "[1]" {
		t.Fatalf("SizeBuckets(1) = %s", got)
	}
	s := openStore(t)
	cfg := api.DefaultConfig()
	cfg.BatchMax, cfg.RelayBatchMax = 8000, 500
	srv, err := api.New(cfg, s, nil, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	srv.Metrics().ObserveBatch("f", 8000, time.Millisecond)
	srv.Metrics().ObserveBatch("f", 4097, time.Millisecond)
	srv.Metrics().ObserveRelayTxn(time.Millisecond, 500)
	srv.Metrics().ObserveCheckpoint(outbox.CheckpointResult{Duration: 3 * time.Millisecond, Busy: true})
	mfs := scrape(t, newTestServer(t, srv))
	for _, c := range []struct {
		name          string
		top           float64
		below, at     uint64 // observations at or below the bucket under top, and at or below top
		count, sample uint64
	}{
		{api.MetricIngestBatchItems, 8000, 0, 2, 2, 0},
		{api.MetricRelayTxnRecords, 500, 0, 1, 1, 0},
	} {
		h := mfs[c.name].GetMetric()[0].GetHistogram()
		bs := h.GetBucket()
		if inf := bs[len(bs)-1]; math.IsInf(inf.GetUpperBound(), 1) {
			bs = bs[:len(bs)-1] // the text format lists +Inf
		}
		last, prev := bs[len(bs)-1], bs[len(bs)-2]
		if last.GetUpperBound() != c.top || last.GetCumulativeCount() != c.at || prev.GetCumulativeCount() != c.below ||
			h.GetSampleCount() != c.count {
			t.Errorf("%s: top bucket le=%v holds %d (the one below %d) of %d, want le=%v holding %d of %d",
				c.name, last.GetUpperBound(), last.GetCumulativeCount(), prev.GetCumulativeCount(), h.GetSampleCount(), c.top, c.at, c.count)
		}
	}
	if h := mfs[api.MetricSQLiteCheckpointSeconds].GetMetric()[0].GetHistogram(); h.GetSampleCount() != 1 ||
		math.Abs(h.GetSampleSum()-0.003) > 1e-12 || value(t, mfs, api.MetricSQLiteCheckpointsBusy) != 1 {
		t.Errorf("checkpoint histogram %d samples sum %v, busy %v", h.GetSampleCount(), h.GetSampleSum(),
			value(t, mfs, api.MetricSQLiteCheckpointsBusy))
	}
}

// TestMetrics_Names: every family follows Prometheus' conventions and says
// what it measures.
func TestMetrics_Names(t *testing.T) {
	h := newHarness(t, api.DefaultConfig())
	h.script()
	for name, mf := range scrape(t, h.ts.URL) {
		if !strings.HasPrefix(name, "outboxd_") {
			continue
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s has no help", name)
		}
		isCounter := mf.GetType() == dto.MetricType_COUNTER
		if isCounter != strings.HasSuffix(name, "_total") {
			t.Errorf("%s is a %v: counters, and only they, end in _total", name, mf.GetType())
		}
		for _, bad := range []string{"_ms", "_milliseconds", "_kb", "_mb", "_size"} {
			if strings.HasSuffix(strings.TrimSuffix(name, "_total"), bad) {
				t.Errorf("%s: use base units (_seconds, _bytes) or say what is counted", name)
			}
		}
	}
}
