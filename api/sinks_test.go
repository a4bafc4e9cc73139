package api_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox/outboxtest"
	"github.com/outboxd/outboxd/sink"
)

func getBody(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	testutil.Must(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	testutil.Must(t, err)
	if res.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, b)
	}
	return string(b)
}

// TestSinks: GET /sinks, the sinks in /outbox/status and the per-sink
// series of /metrics show each sink's state, lag and last error.
func TestSinks(t *testing.T) {
	srv, err := api.New(api.DefaultConfig(), outboxtest.TempStore(t), nil, nil, quiet())
	testutil.Must(t, err)
	st := []api.SinkStatus{{Name: "js", Kind: "nats", URL: "nats://h:4222", State: sink.StateBackingOff, Topics: []string{"a"},
		Delivered: 7, Stored: 6, LagRows: 3, LagBytes: 300, DeliveredTotal: 5, DeadLettered: 1, Errors: 2, Missed: 4,
		LastError: "connection refused", LastErrorAt: time.Unix(1, 0).UTC()}}
	srv.SetSinks(func() []api.SinkStatus { return st })
	base := newTestServer(t, srv)

	want := `{"sinks":[{"name":"js","kind":"nats","url":"nats://h:4222","state":"backing-off","topics":["a"],` +
		`"deliveredId":7,"storedId":6,"lagRows":3,"lagBytes":300,"deliveredTotal":5,"deadLettered":1,"errors":2,"missed":4,` +
		`"lastError":"connection refused","lastErrorAt":"1970-01-01T00:00:01Z"}]}`
	if got := strings.TrimSpace(getBody(t, base+"/sinks")); got != want {
		t.Fatalf("GET /sinks\n%s\nwant\n%s", got, want)
	}
	if got := getBody(t, base+"/outbox/status"); !strings.Contains(got,
		`"sinks":[{"name":"js","state":"backing-off","lagRows":3,"lagBytes":300,"lastError":"connection refused"}]`) {
		t.Fatalf("GET /outbox/status: %s", got)
	}
	metrics := getBody(t, base+"/metrics")
	for _, line := range []string{
		`outboxd_sink_delivered_total{sink="js"} 5`,
		`outboxd_sink_dead_lettered_total{sink="js"} 1`,
		`outboxd_sink_errors_total{sink="js"} 2`,
		`outboxd_sink_missed_total{sink="js"} 4`,
		`outboxd_sink_lag_rows{sink="js"} 3`,
		`outboxd_sink_lag_bytes{sink="js"} 300`,
		`outboxd_sink_delivered_id{sink="js"} 7`,
		`outboxd_sink_state{sink="js",state="backing-off"} 1`,
		`outboxd_sink_state{sink="js",state="idle"} 0`,
	} {
		if !strings.Contains(metrics, "\n"+line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}
