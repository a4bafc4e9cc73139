package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

func getReadyz(t *testing.T, c *http.Client, base string) (int, api.Readiness, time.Duration) {
	t.Helper()
	t0 := time.Now()
	res, err := c.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz after %v: %v", time.Since(t0), err)
	}
	defer res.Body.Close()
	var rd api.Readiness
	if err := json.NewDecoder(res.Body).Decode(&rd); err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, rd, time.Since(t0)
}

// A long batch holds the one writer connection: readiness answers without
// waiting for it.
func TestReadyz_NotBehindABatch(t *testing.T) {
	h := newHarness(t, api.DefaultConfig())
	h.append("a,1\n")
	h.waitPosition(4, "", outbox.StateCaughtUp)
	tx, err := h.store.Begin(context.Background()) // the batch
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	c := &http.Client{Timeout: 5 * time.Second}
	for range 3 {
		code, rd, took := getReadyz(t, c, h.ts.URL)
		if code != http.StatusOK || !rd.Ready {
			t.Fatalf("readyz %d %+v while a batch holds the writer, want 200", code, rd)
		}
		if took > time.Second {
			t.Fatalf("readyz took %v while a batch holds the writer", took)
		}
	}
}

// A stalled feed makes the process unready, naming the feed and the cause;
// once the cause is gone, the feed resumes and the process is ready again.
func TestReadyz_StalledFeed(t *testing.T) {
	h := newTunedHarness(t, api.DefaultConfig(), func(cfg *ingest.Config) {
		cfg.OnCompletionFailure = ingest.OnCompletionStop
		cfg.StallMaxDelay = 20 * time.Millisecond
	})
	h.append("a,1\n")
	h.waitPosition(4, "", outbox.StateCaughtUp)
	h.store.SetCommitHook(func(context.Context) error { return errors.New(injectedErr) })
	h.append("b,2\n")
	c := &http.Client{Timeout: 5 * time.Second}
	const why = "completion failure: store error: commit: " + injectedErr
	wait(t, 10*time.Second, func() error {
		code, rd, _ := getReadyz(t, c, h.ts.URL)
		want := []string{"database: not writable: the last write", "feed:ledger: stalled: " + why}
		if code != http.StatusServiceUnavailable || len(rd.Reasons) != 2 ||
			!strings.HasPrefix(rd.Reasons[0], want[0]) || rd.Reasons[1] != want[1] {
			return fmt.Errorf("readyz %d %q, want 503 with %q", code, rd.Reasons, want)
		}
		return nil
	})
	var fs api.FeedStatus
	h.getJSON("/feeds/ledger/status", &fs)
	if fs.State != outbox.StateStalled || fs.LastError != why || fs.Position != 4 || fs.Applied != 1 {
		t.Fatalf("status %s, want stalled at 4 with the reason", jsonString(t, fs))
	}

	h.store.SetCommitHook(nil)
	h.waitPosition(8, "", outbox.StateCaughtUp)
	wait(t, 10*time.Second, func() error {
		if code, rd, _ := getReadyz(t, c, h.ts.URL); code != http.StatusOK {
			return fmt.Errorf("readyz %d %q after the feed resumed", code, rd.Reasons)
		}
		return nil
	})
	h.getJSON("/feeds/ledger/status", &fs)
	if fs.State != outbox.StateCaughtUp || fs.LastError != "" || fs.Position != 8 || fs.Applied != 2 || !fs.Lossless {
		t.Fatalf("status %s, want caught-up at 8, nothing lost", jsonString(t, fs))
	}
}

// A failed feed fails readiness, naming it; a waiting one does not.
func TestReadyz_FeedStates(t *testing.T) {
	var mu sync.Mutex
	state, lastError := outbox.StateFailed, "open feed f: permission denied"
	f := &stubFeed{name: "f", state: func() (outbox.FeedState, string) {
		mu.Lock()
		defer mu.Unlock()
		return state, lastError
	}}
	srv := openServer(t, api.Config{}, []api.Feed{f}, nil, quiet())
	c := &http.Client{Timeout: 5 * time.Second}
	code, rd, _ := getReadyz(t, c, srv.URL())
	if code != http.StatusServiceUnavailable || len(rd.Reasons) != 1 || rd.Reasons[0] != "feed:f: failed: open feed f: permission denied" {
		t.Fatalf("readyz %d %+v, want 503 naming the failed feed", code, rd)
	}
	mu.Lock()
	state, lastError = outbox.StateWaiting, "waiting for /in.csv to be created"
	mu.Unlock()
	code, rd, _ = getReadyz(t, c, srv.URL())
	if code != http.StatusOK || rd.Checks[2] != (api.Check{Name: "feed:f", OK: true, Message: "waiting: waiting for /in.csv to be created"}) {
		t.Fatalf("readyz %d %+v, want 200 with the feed waiting", code, rd)
	}
	var fs api.FeedStatus
	_, _, b := request(t, srv.URL(), http.MethodGet, "/feeds/f/status", "", nil)
	if err := json.Unmarshal(b, &fs); err != nil || fs.State != outbox.StateWaiting || fs.LastError != lastError {
		t.Fatalf("status %s, want waiting with the reason", b)
	}
}

// Every status answer comes from one snapshot: with lines of 4 bytes, one
// output each and nothing published, position = 4 x applied = 4 x
// pending in every answer, while lines keep coming; and the state is
// caught-up exactly when the lag is 0.
func TestStatus_OneSnapshot(t *testing.T) {
	h := newTunedHarness(t, api.DefaultConfig(), func(cfg *ingest.Config) { cfg.BatchWait = 0 })
	wait(t, 10*time.Second, func() error { // the loop has opened the feed
		if st, _ := h.feed.State(); st != outbox.StateCaughtUp {
			return fmt.Errorf("state %s, want caught-up", st)
		}
		return nil
	})
	const lines = 300
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range lines {
			h.append(fmt.Sprintf("%c,1\n", 'a'+i%26))
		}
	}()
	check := func(fs api.FeedStatus) error {
		if fs.Position != 4*fs.Applied || fs.Outbox.Pending != fs.Applied {
			return fmt.Errorf("position %d, applied %d, pending %d: not from one commit", fs.Position, fs.Applied, fs.Outbox.Pending)
		}
		if fs.Lag != fs.End-fs.Position || (fs.State == outbox.StateCaughtUp) != (fs.Lag == 0) ||
			(fs.State != outbox.StateCaughtUp && fs.State != outbox.StateRunning) {
			return fmt.Errorf("state %s with lag %d (end %d, position %d)", fs.State, fs.Lag, fs.End, fs.Position)
		}
		return nil
	}
	answers := 0
	for {
		var fs api.FeedStatus
		h.getJSON("/feeds/ledger/status", &fs)
		var list api.FeedList
		h.getJSON("/feeds", &list)
		if err := check(fs); err != nil {
			t.Fatal(err)
		}
		if s := list.Feeds[0]; s.Position != 4*s.Applied || (s.State == outbox.StateCaughtUp) != (s.Lag == 0) {
			t.Fatalf("GET /feeds: %+v: not from one commit", s)
		}
		answers++
		if fs.Applied == lines {
			break
		}
	}
	<-done
	t.Logf("%d consistent answers while %d lines were applied", answers, lines)
}

// A line not yet whole is input not applied: the feed is running with the
// lag, not caught-up; caught-up again once it is whole and applied.
func TestStatus_CaughtUpIffLagZero(t *testing.T) {
	h := newHarness(t, api.DefaultConfig())
	h.append("a,1\n")
	h.waitPosition(4, "", outbox.StateCaughtUp)
	h.append("b,")
	wait(t, 5*time.Second, func() error {
		if end := h.feed.Ends()[0]; end != 6 {
			return fmt.Errorf("end %d, want 6", end)
		}
		return nil
	})
	var fs api.FeedStatus
	h.getJSON("/feeds/ledger/status", &fs)
	if fs.State != outbox.StateRunning || fs.Lag != 2 || fs.Position != 4 || fs.End != 6 {
		t.Fatalf("status %s, want running at 4 of 6 (lag 2)", jsonString(t, fs))
	}
	if st, _ := h.feed.State(); st != outbox.StateRunning {
		t.Fatalf("the loop says %s with 2 bytes unread, want running", st)
	}
	h.append("2\n")
	h.waitPosition(8, "", outbox.StateCaughtUp)
	h.getJSON("/feeds/ledger/status", &fs)
	if fs.State != outbox.StateCaughtUp || fs.Lag != 0 || fs.Position != 8 || fs.End != 8 {
		t.Fatalf("status %s, want caught-up at 8 of 8", jsonString(t, fs))
	}
}

// A loss whose extent is unknown shows as such: no number made up for it.
func TestStatus_LossOfUnknownExtent(t *testing.T) {
	h := newHarness(t, api.DefaultConfig())
	h.append("a,1\n")
	h.waitPosition(4, "", outbox.StateCaughtUp)
	tx, err := h.store.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []outbox.Loss{
		{Feed: feedName, Reason: "truncated, no copy found", Epoch: "e", From: 4, To: ingest.UnknownPosition},
		{Feed: feedName, Reason: "rotated away unread", Epoch: "e", From: 4, To: 9},
	} {
		if err := tx.RecordLoss(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	_, _, b := h.do(http.MethodGet, "/feeds/ledger/status", "", nil)
	var raw struct {
		Losses    []map[string]json.RawMessage `json:"losses"`
		LossCount int                          `json:"lossCount"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw.Losses) != 2 || raw.LossCount != 2 {
		t.Fatalf("losses %s", b)
	}
	for i, want := range [][2]string{{"null", `"unknown"`}, {"9", `"known"`}} {
		if got := [2]string{string(raw.Losses[i]["to"]), string(raw.Losses[i]["extent"])}; got != want {
			t.Errorf("loss %d: to %s, extent %s; want %s, %s", i, got[0], got[1], want[0], want[1])
		}
	}
	var list api.FeedList
	h.getJSON("/feeds", &list)
	if !strings.HasSuffix(list.Feeds[0].Line, "NOT LOSSLESS (2 losses)") {
		t.Fatalf("line %q", list.Feeds[0].Line)
	}
}
