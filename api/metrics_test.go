package api_test

import (
	"bytes"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxd/outboxd/api"
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
	var os api.OutboxStatus
	h.getJSON("/outbox/status", &os)
	mfs := scrape(t, h.ts.URL)

	f := []string{"feed", feedName}
	for name, want := range map[string]float64{
		api.MetricFeedApplied:            float64(fs.Applied),
		api.MetricFeedReplaysSkipped:     float64(fs.ReplaysSkipped),
		api.MetricFeedRetries:            float64(fs.Retries),
		api.MetricFeedDeadLettered:       float64(fs.DeadLettered),
		api.MetricFeedCompletionFailures: float64(fs.CompletionFailures),
		api.MetricFeedEpochChanges:       float64(fs.EpochChanges),
		api.MetricFeedLosses:             float64(len(fs.Losses)),
		api.MetricFeedLossless:           b01(fs.Lossless),
		api.MetricFeedPosition:           float64(fs.Position),
		api.MetricFeedEnd:                float64(fs.End),
		api.MetricFeedLag:                float64(fs.Lag),
		api.MetricFeedLastApplied:        float64(fs.LastAppliedAt.Unix()),
		api.MetricFeedOutboxPending:      float64(fs.Outbox.Pending),
		api.MetricFeedOutboxOldestAge:    fs.Outbox.OldestPendingAge,
	} {
		if got := value(t, mfs, name, f...); got != want {
			t.Errorf("%s = %v, status says %v", name, got, want)
		}
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
		api.MetricOutboxPending:         float64(os.Pending),
		api.MetricOutboxOldestAge:       os.OldestPendingAge,
		api.MetricOutboxLastPublishedID: float64(os.LastPublishedID),
		api.MetricOutboxLastID:          float64(os.LastOutboxID),
		api.MetricRelayPublished:        float64(os.Published),
		api.MetricRelayConnected:        b01(os.Relay.Connected),
		api.MetricRelayFenced:           b01(os.Relay.Fenced),
	} {
		if got := value(t, mfs, name); got != want {
			t.Errorf("%s = %v, status says %v", name, got, want)
		}
	}
	if value(t, mfs, api.MetricRelayState, "mode", "none", "state", "off") != 1 {
		t.Errorf("%s{mode=none,state=off} is not 1", api.MetricRelayState)
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
		{hist(api.MetricIngestBatchSize, f...), 1, 7},
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
	r.set(api.RelayStatus{Mode: "exactly-once", State: "idle", Connected: true, LastPublishedID: 0, PublishedTotal: 42})
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
	var m *api.Metrics // nil: the hooks do nothing
	m.ObserveBatch("x", 1, time.Second)
	m.ObserveRelayTxn(time.Second, 1)
}
