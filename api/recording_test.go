package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/outbox"
)

// recordedFeed is a configured feed whose recording reports st.
type recordedFeed struct {
	name string
	st   *api.RecordingStatus
}

func (f recordedFeed) Name() string                      { return f.name }
func (f recordedFeed) Kind() string                      { return "file" }
func (f recordedFeed) Source() string                    { return "/in.csv" }
func (f recordedFeed) Processor() string                 { return "ledger" }
func (f recordedFeed) State() (outbox.FeedState, string) { return outbox.StateRunning, "" }
func (f recordedFeed) Ends() map[int32]int64             { return nil }
func (f recordedFeed) Requeue(context.Context, int64, outbox.Requeue) (bool, error) {
	return false, nil
}
func (f recordedFeed) Recording() *api.RecordingStatus { return f.st }

// TestStatus_Recording: a recorded feed's status and metrics say whether
// it records, where and how much, as the spec describes; a feed not
// recorded has neither.
func TestStatus_Recording(t *testing.T) {
	store := openStore(t)
	st := &api.RecordingStatus{Recording: false, File: "/rec/a-0002.rec", Bytes: 74200941, Files: 2, Error: "write recording: no space left on device"}
	feeds := []api.Feed{recordedFeed{"a", st}, recordedFeed{"b", nil}}
	srv, err := api.New(api.DefaultConfig(), store, feeds, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	base := newTestServer(t, srv)
	c := newSpecChecker(t)
	var fs api.FeedStatus
	if err := json.Unmarshal(c.check(base, "GET", "/feeds/a/status", "", 200), &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Recording == nil || *fs.Recording != *st {
		t.Fatalf("recording %+v, want %+v", fs.Recording, st)
	}
	b := c.check(base, "GET", "/feeds/b/status", "", 200)
	if strings.Contains(string(b), `"recording"`) {
		t.Fatalf("a feed not recorded has a recording: %s", b)
	}
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	m, _ := io.ReadAll(res.Body)
	for _, want := range []string{api.MetricFeedRecording + `{feed="a"} 0`, api.MetricFeedRecordingBytes + `{feed="a"} 7.4200941e+07`} {
		if !strings.Contains(string(m), want+"\n") {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(m), `recording{feed="b"}`) || strings.Contains(string(m), `recording_bytes{feed="b"}`) {
		t.Fatal("/metrics reports a recording of a feed not recorded")
	}
}
