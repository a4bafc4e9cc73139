package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/api"
)

// TestOverview_Verdict: the verdict names the worst thing true (a loss
// before dead letters, an unauthorized relay before a stall), lists the
// rest, and says ok once everything is resolved.
func TestOverview_Verdict(t *testing.T) {
	cfg := api.DefaultConfig()
	cfg.AdminToken = testToken
	h := newHarness(t, cfg)
	h.script() // two dead letters, two losses
	var ov api.Overview
	h.getJSON("/status", &ov)
	codes := func(v api.Verdict) string {
		var cs []string
		for _, c := range v.Conditions {
			cs = append(cs, c.Code+":"+c.Subject)
		}
		return strings.Join(cs, " ")
	}
	if got := codes(ov.Verdict); got != "not-lossless:ledger dead-letters:ledger" {
		t.Fatalf("conditions %q", got)
	}
	v := ov.Verdict
	if v.Level != api.LevelCritical || !strings.Contains(v.Message, "feed ledger is NOT LOSSLESS: 2 losses not acknowledged, the latest truncated before read (partition 0, from 25, extent unknown)") ||
		!strings.Contains(v.Action, "outboxd losses ack ledger --reason") {
		t.Fatalf("verdict %s", jsonString(t, v))
	}
	if d := ov.Verdict.Conditions[1]; d.Level != api.LevelWarning || d.Message != "2 dead letters of feed ledger in the last hour, not resolved" {
		t.Fatalf("dead letters %s", jsonString(t, d))
	}
	if len(ov.RecentDeadLetters) != 1 || ov.RecentDeadLetters[0] != (api.RecentDeadLetters{Feed: "ledger", Count: 2}) {
		t.Fatalf("recent dead letters %+v", ov.RecentDeadLetters)
	}

	// Resolved: the losses acknowledged, the dead letters discarded.
	if code, _, b := h.do(http.MethodPost, "/feeds/ledger/losses/ack", testToken, strings.NewReader(`{"reason":"replayed"}`)); code != 200 {
		t.Fatalf("ack: %d %s", code, b)
	}
	for _, reason := range []string{"malformed", "rejected"} {
		if code, _, b := h.do(http.MethodPost, "/feeds/ledger/dead-letters/discard?reason="+reason, testToken, strings.NewReader(`{"note":"test"}`)); code != 200 {
			t.Fatalf("discard: %d %s", code, b)
		}
	}
	h.getJSON("/status", &ov)
	if ov.Verdict.Level != api.LevelOK || len(ov.Verdict.Conditions) != 0 || len(ov.RecentDeadLetters) != 0 {
		t.Fatalf("verdict once resolved %s", jsonString(t, ov.Verdict))
	}

	// The relay: unauthorized is critical, before a warning.
	r := &fakeRelay{}
	srv, err := api.New(api.DefaultConfig(), h.store, nil, r, quiet())
	if err != nil {
		t.Fatal(err)
	}
	base := newTestServer(t, srv)
	r.set(api.RelayStatus{Mode: "exactly-once", State: "unauthorized", LastError: "TOPIC_AUTHORIZATION_FAILED: Write on topic ledger.out"})
	if code, _, b := request(t, base, http.MethodGet, "/status", "", nil); code != 200 || !strings.Contains(string(b), `"verdict":{"level":"critical","message":"Kafka refuses the relay: TOPIC_AUTHORIZATION_FAILED`) {
		t.Fatalf("unauthorized relay: %d %s", code, b)
	}
	r.set(api.RelayStatus{Mode: "exactly-once", State: "backing-off", LastError: "connection refused"})
	if code, _, b := request(t, base, http.MethodGet, "/status", "", nil); code != 200 || !strings.Contains(string(b), `"verdict":{"level":"warning","message":"the relay is not connected (backing-off): connection refused"`) {
		t.Fatalf("relay down: %d %s", code, b)
	}
}
