package api_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// wantStatus is the status after harness.script, exactly.
func (h *harness) wantStatus() api.FeedStatus {
	h.t.Helper()
	epoch2 := h.checkpoint().Epoch
	at := clock
	return api.FeedStatus{
		Feed: feedName, Kind: "file", Source: h.path, Processor: "ledger", State: "caught-up", Configured: true,
		Epoch: epoch2, Position: 4, End: 4, Lag: 0,
		Partitions: []api.PartitionStatus{{Partition: 0, Epoch: epoch2, Position: 4, End: 4, Lag: 0}},
		Applied:    4, ReplaysSkipped: 3, Retries: 1, DeadLettered: 2, CompletionFailures: 1, EpochChanges: 1,
		Lossless: false,
		Losses: []api.LossStatus{
			{At: at, Reason: "completion failure skipped: commit: " + injectedErr, Partition: 0, Epoch: h.epoch1, From: 17, To: known(21), Extent: api.ExtentKnown},
			// Bytes 25..28 were seen unread, and more may have been written
			// before the truncation: with no copy left, the extent is unknown.
			{At: at, Reason: "truncated before read", Partition: 0, Epoch: h.epoch1, From: 25, To: nil, Extent: api.ExtentUnknown},
		},
		LossCount: 2,
		LastError: "", LastAppliedAt: &at,
		// a, b, d and f's outputs and the two dead letters; nothing is
		// published (no relay) and the clock stands still.
		Outbox: api.Backlog{Pending: 6, OldestPendingAge: 0}, Topics: []string{},
	}
}

func TestStatus_Scripted(t *testing.T) {
	h := newHarness(t, api.DefaultConfig())
	h.script()
	want := h.wantStatus()
	if !strings.HasSuffix(want.Epoch, ":t1") || want.Epoch == h.epoch1 {
		t.Fatalf("epoch after truncation %q (before %q): want a new epoch ending :t1", want.Epoch, h.epoch1)
	}

	t.Run("Status", func(t *testing.T) {
		code, hdr, b := h.do(http.MethodGet, "/feeds/ledger/status", "", nil)
		if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
			t.Fatalf("status %d, content type %q: %s", code, hdr.Get("Content-Type"), b)
		}
		var got api.FeedStatus
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if g, w := jsonString(t, got), jsonString(t, want); g != w {
			t.Fatalf("status:\n%s\nwant:\n%s", g, w)
		}
	})

	t.Run("FieldNames", func(t *testing.T) {
		// The issue names these fields exactly.
		_, _, b := h.do(http.MethodGet, "/feeds/ledger/status", "", nil)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"feed", "kind", "source", "processor", "state", "epoch", "position", "end", "lag",
			"applied", "replaysSkipped", "retries", "deadLettered", "completionFailures", "lossless", "losses",
			"lastError", "lastAppliedAt", "epochChanges", "outbox"} {
			if _, ok := m[k]; !ok {
				t.Errorf("field %q missing from %s", k, b)
			}
		}
		var losses []map[string]any
		json.Unmarshal(m["losses"], &losses)
		for _, k := range []string{"at", "reason", "from", "to"} {
			if _, ok := losses[0][k]; !ok {
				t.Errorf("loss field %q missing from %s", k, m["losses"])
			}
		}
		var ob map[string]any
		json.Unmarshal(m["outbox"], &ob)
		for _, k := range []string{"pending", "oldestPendingAge"} {
			if _, ok := ob[k]; !ok {
				t.Errorf("outbox field %q missing from %s", k, m["outbox"])
			}
		}
	})

	t.Run("Feeds", func(t *testing.T) {
		var got api.FeedList
		h.getJSON("/feeds", &got)
		want := api.FeedList{Feeds: []api.FeedSummary{{
			Feed: feedName, Kind: "file", Source: h.path, Processor: "ledger", State: "caught-up", Configured: true,
			Position: 4, End: 4, Lag: 0, Applied: 4, DeadLettered: 2, CompletionFailures: 1, Lossless: false,
			Line: "caught-up at 4/4 (lag 0), 4 applied, 2 dead-lettered, 1 completion failures, NOT LOSSLESS (2 losses)",
		}}}
		if g, w := jsonString(t, got), jsonString(t, want); g != w {
			t.Fatalf("feeds:\n%s\nwant:\n%s", g, w)
		}
	})

	t.Run("Outbox", func(t *testing.T) {
		var got api.OutboxStatus
		h.getJSON("/outbox/status", &got)
		var bytes int64
		if err := outboxtest.Get(t.Context(), h.store, &bytes, `SELECT sum(bytes) FROM outbox_chunks`); err != nil {
			t.Fatal(err)
		}
		want := api.OutboxStatus{Pending: 6, PendingBytes: bytes, LastOutboxID: 6, Relay: api.RelayStatusJSON{Mode: "none", State: "off"},
			Sinks: []api.SinkSummary{}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("outbox status %+v, want %+v", got, want)
		}
	})

	t.Run("DeadLetters", func(t *testing.T) {
		var page api.DeadLetterPage
		h.getJSON("/feeds/ledger/dead-letters", &page)
		if len(page.DeadLetters) != 2 || page.Next != nil {
			t.Fatalf("page %s: want 2 dead letters and no next page", jsonString(t, page))
		}
		junk, x := page.DeadLetters[0], page.DeadLetters[1]
		wantJunk := api.DeadLetterJSON{
			ID: junk.ID, Delivery: api.DeliveryJSON{Partition: 0, Epoch: h.epoch1, Position: 13, Sequence: junk.Delivery.Sequence},
			Reason: "malformed", Error: "no comma: want account,amount", Attempts: 1, At: clock,
			Key: "", KeyEncoding: "utf-8", Payload: "junk", PayloadEncoding: "utf-8", PayloadBytes: 4, Headers: []api.HeaderJSON{},
			Resolution: api.ResolutionOpen,
		}
		if g, w := jsonString(t, junk), jsonString(t, wantJunk); g != w {
			t.Fatalf("dead letter:\n%s\nwant:\n%s", g, w)
		}
		if x.Payload != "x,7" || x.Reason != "rejected" || x.Error != "rejected this time" || x.Delivery.Position != 17 || x.ID <= junk.ID {
			t.Fatalf("second dead letter %s", jsonString(t, x))
		}

		var first, second api.DeadLetterPage
		h.getJSON("/feeds/ledger/dead-letters?limit=1", &first)
		if len(first.DeadLetters) != 1 || first.Next == nil || *first.Next != junk.ID {
			t.Fatalf("first page %s", jsonString(t, first))
		}
		h.getJSON("/feeds/ledger/dead-letters?limit=1&after="+itoa(*first.Next), &second)
		if len(second.DeadLetters) != 1 || second.DeadLetters[0].ID != x.ID {
			t.Fatalf("second page %s", jsonString(t, second))
		}
		for _, q := range []string{"?limit=0", "?limit=1001", "?limit=x", "?after=-1", "?after=y"} {
			code, _, b := h.do(http.MethodGet, "/feeds/ledger/dead-letters"+q, readerToken, nil)
			wantError(t, q, code, b, http.StatusBadRequest, api.CodeBadRequest)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		for _, p := range []string{"/feeds/nope/status", "/feeds/nope/dead-letters", "/nothing/here"} {
			code, _, b := h.do(http.MethodGet, p, readerToken, nil)
			wantError(t, p, code, b, http.StatusNotFound, api.CodeNotFound)
		}
		code, _, b := h.do(http.MethodDelete, "/feeds", "", nil)
		wantError(t, "DELETE /feeds", code, b, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed)
	})
}

func TestStatus_Admin(t *testing.T) {
	cfg := api.DefaultConfig()
	cfg.AdminToken = testToken
	h := newHarness(t, cfg)
	h.script()
	dls := func() []api.DeadLetterJSON {
		var page api.DeadLetterPage
		h.getJSON("/feeds/ledger/dead-letters", &page)
		return page.DeadLetters
	}
	junk, x := dls()[0], dls()[1]
	requeue := func(id int64) string { return "/feeds/ledger/dead-letters/" + itoa(id) + "/requeue" }

	t.Run("Unauthorized", func(t *testing.T) {
		for _, p := range []string{requeue(x.ID), "/feeds/ledger/losses/ack"} {
			for _, tok := range []string{"", "wrong-token-0123456789", testToken + "x", testToken[:len(testToken)-1]} {
				code, hdr, b := h.do(http.MethodPost, p, tok, nil)
				wantError(t, p+" with token "+tok, code, b, http.StatusUnauthorized, api.CodeUnauthorized)
				if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("WWW-Authenticate %q", hdr.Get("WWW-Authenticate"))
				}
			}
		}
		if st := h.stats(); st.Applied != 4 || st.Lossless {
			t.Fatalf("an unauthorized request changed the feed: %+v", st)
		}
	})

	t.Run("Requeue", func(t *testing.T) {
		for i, want := range []bool{true, false} { // twice: applied once
			code, _, b := h.do(http.MethodPost, requeue(x.ID), testToken, nil)
			var res api.RequeueResult
			if code != http.StatusOK || json.Unmarshal(b, &res) != nil || res.Requeued != want || res.ID != x.ID {
				t.Fatalf("requeue #%d: %d %s, want requeued %v", i+1, code, b, want)
			}
		}
		st := h.stats()
		if st.Applied != 5 || st.DeadLettered != 2 {
			t.Fatalf("after requeue: applied %d, dead-lettered %d; want 5 and 2", st.Applied, st.DeadLettered)
		}
		var fs api.FeedStatus
		h.getJSON("/feeds/ledger/status", &fs)
		if fs.Applied != 5 || fs.Outbox.Pending != 7 {
			t.Fatalf("status after requeue: applied %d, pending %d; want 5 and 7", fs.Applied, fs.Outbox.Pending)
		}
		if got := dls()[1]; got.RequeuedAt == nil || !got.RequeuedAt.Equal(clock) {
			t.Fatalf("requeuedAt %v, want %v", got.RequeuedAt, clock)
		}

		code, _, b := h.do(http.MethodPost, requeue(junk.ID), testToken, nil)
		wantError(t, "requeue of a still malformed item", code, b, http.StatusUnprocessableEntity, api.CodeRequeueFailed)
		code, _, b = h.do(http.MethodPost, requeue(999), testToken, nil)
		wantError(t, "requeue of an unknown id", code, b, http.StatusNotFound, api.CodeNotFound)
		code, _, b = h.do(http.MethodPost, "/feeds/ledger/dead-letters/zero/requeue", testToken, nil)
		wantError(t, "requeue of a bad id", code, b, http.StatusBadRequest, api.CodeBadRequest)
		code, _, b = h.do(http.MethodPost, "/feeds/nope/dead-letters/1/requeue", testToken, nil)
		wantError(t, "requeue in an unknown feed", code, b, http.StatusNotFound, api.CodeNotFound)
		if st := h.stats(); st.Applied != 5 {
			t.Fatalf("failed requeues changed applied: %d", st.Applied)
		}
	})

	t.Run("AckLosses", func(t *testing.T) {
		code, _, b := h.do(http.MethodPost, "/feeds/ledger/losses/ack", testToken, strings.NewReader(`{"reason":"reviewed"}`))
		var res api.AckResult
		if code != http.StatusOK || json.Unmarshal(b, &res) != nil || res != (api.AckResult{Feed: feedName, Acked: 2, Lossless: true, By: api.AdminTokenName}) {
			t.Fatalf("ack: %d %s", code, b)
		}
		var fs api.FeedStatus
		h.getJSON("/feeds/ledger/status", &fs)
		if !fs.Lossless || len(fs.Losses) != 2 {
			t.Fatalf("after ack: lossless %v with %d losses; want true, the 2 kept", fs.Lossless, len(fs.Losses))
		}
		for _, l := range fs.Losses {
			if l.AckedAt == nil || !l.AckedAt.Equal(clock) || l.AckedBy != api.AdminTokenName || l.AckReason != "reviewed" {
				t.Fatalf("loss %+v not marked acked", l)
			}
		}
		code, _, b = h.do(http.MethodPost, "/feeds/ledger/losses/ack", testToken, strings.NewReader(`{"reason":"reviewed"}`))
		if code != http.StatusOK || json.Unmarshal(b, &res) != nil || res.Acked != 0 {
			t.Fatalf("second ack: %d %s, want 0 acked", code, b)
		}
		code, _, b = h.do(http.MethodPost, "/feeds/nope/losses/ack", testToken, nil)
		wantError(t, "ack of an unknown feed", code, b, http.StatusNotFound, api.CodeNotFound)
	})
}

func TestStatus_AdminDisabled(t *testing.T) {
	s := openStore(t)
	srv, err := api.New(api.DefaultConfig(), s, nil, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, srv)
	for _, p := range []string{"/feeds/a/dead-letters/1/requeue", "/feeds/a/losses/ack"} {
		for _, tok := range []string{"", testToken} {
			code, _, b := request(t, ts, http.MethodPost, p, tok, nil)
			wantError(t, p, code, b, http.StatusForbidden, api.CodeAdminDisabled)
			if !strings.Contains(string(b), "--admin-token-file") || !strings.Contains(string(b), api.EnvAdminToken) {
				t.Fatalf("the 403 does not say how to enable the endpoint: %s", b)
			}
		}
	}
}

// TestStatus_StoredOnly: a feed in the database that this process does not
// run is listed, stopped, and its dead letters cannot be requeued.
func TestStatus_StoredOnly(t *testing.T) {
	h := newHarness(t, api.Config{AdminToken: testToken})
	h.append("a,1\n")
	h.waitPosition(4, "", "caught-up")
	srv, err := api.New(api.Config{AdminToken: testToken}, h.store, nil, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, srv)
	code, _, b := request(t, ts, http.MethodGet, "/feeds/ledger/status", "", nil)
	var fs api.FeedStatus
	if code != http.StatusOK || json.Unmarshal(b, &fs) != nil {
		t.Fatalf("%d %s", code, b)
	}
	if fs.Configured || fs.State != "stopped" || fs.Position != 4 || fs.End != 4 || fs.Applied != 1 || fs.Kind != "file" {
		t.Fatalf("stored-only status %s", jsonString(t, fs))
	}
	code, _, b = request(t, ts, http.MethodPost, "/feeds/ledger/dead-letters/1/requeue", testToken, nil)
	wantError(t, "requeue in a stored-only feed", code, b, http.StatusConflict, api.CodeFeedNotRunning)
}

// TestStatus_NeverBlocksIngest: while the writer connection is held (an
// ingest transaction in progress), status reads still answer at once.
func TestStatus_NeverBlocksIngest(t *testing.T) {
	h := newHarness(t, api.DefaultConfig())
	h.append("a,1\n")
	h.waitPosition(4, "", "caught-up")
	tx, err := h.store.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	start := time.Now()
	for _, p := range []string{"/feeds", "/feeds/ledger/status", "/outbox/status", "/feeds/ledger/dead-letters", "/metrics"} {
		if code, _, b := h.do(http.MethodGet, p, readerToken, nil); code != http.StatusOK {
			t.Fatalf("GET %s with a writer busy: %d %s", p, code, b)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("status reads took %v while a transaction was open", d)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// known is the To of a loss of known extent.
func known(to int64) *int64 { return &to }
