package api_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestDeadLetters_Resolve: dead letters read with a read token only; the
// actions need an admin token and record its name: a malformed line
// requeued with an edited payload applies once; a discard keeps the dead
// letter with who and why; requeue-all of a reason applies each open one.
func TestDeadLetters_Resolve(t *testing.T) {
	cfg := api.DefaultConfig()
	cfg.Tokens = []api.Token{{Name: "alice", Role: api.RoleAdmin, Secret: testToken}}
	h := newHarness(t, cfg)
	h.proc.permanent["x,7"] = 1 // a dead letter that applies once requeued
	h.proc.permanent["y,8"] = 1
	h.append("a,1\njunk\nx,7\nmore junk\ny,8\n")
	h.waitPosition(27, "", "caught-up")
	list := func(q string) []api.DeadLetterJSON {
		var page api.DeadLetterPage
		h.getJSON("/feeds/ledger/dead-letters"+q, &page)
		return page.DeadLetters
	}
	dls := list("")
	if len(dls) != 4 {
		t.Fatalf("%d dead letters, want 4", len(dls))
	}
	junk, x, more, y := dls[0], dls[1], dls[2], dls[3]
	post := func(path, tok, body string) (int, []byte) {
		t.Helper()
		code, _, b := h.do(http.MethodPost, path, tok, strings.NewReader(body))
		return code, b
	}
	base := "/feeds/ledger/dead-letters/"

	t.Run("ReadTokenReadsOnly", func(t *testing.T) {
		code, b := post(base+itoa(junk.ID)+"/discard", readerToken, `{"note":"n"}`)
		wantError(t, "discard with a read token", code, b, http.StatusForbidden, api.CodeForbidden)
		code, _, b = h.do(http.MethodGet, base[:len(base)-1], "", nil)
		wantError(t, "list without a token", code, b, http.StatusUnauthorized, api.CodeUnauthorized)
	})
	t.Run("RequeueEdited", func(t *testing.T) {
		before := h.stats().Applied
		code, b := post(base+itoa(junk.ID)+"/requeue", testToken, `{"payload":"junk,5","note":"missing comma"}`)
		var res api.RequeueResult
		if code != http.StatusOK || json.Unmarshal(b, &res) != nil || !res.Requeued {
			t.Fatalf("edited requeue: %d %s", code, b)
		}
		if got := h.stats().Applied; got != before+1 {
			t.Fatalf("applied %d, want %d", got, before+1)
		}
		var got api.DeadLetterJSON
		h.getJSON(base+itoa(junk.ID), &got)
		if got.Resolution != api.ResolutionRequeued || !got.RequeueEdited || got.ResolvedBy != "alice" || got.Note != "missing comma" || got.Payload != "junk" {
			t.Fatalf("dead letter after the edited requeue: %s", jsonString(t, got))
		}
		var balance int64
		if err := outboxtest.Get(t.Context(), h.store, &balance, `SELECT balance FROM ledger_balances WHERE account = 'junk'`); err != nil || balance != 5 {
			t.Fatalf("balance of the edited line's account %d (%v), want 5", balance, err)
		}
	})
	t.Run("Discard", func(t *testing.T) {
		code, b := post(base+itoa(more.ID)+"/discard", testToken, `{"note":"a test line"}`)
		var res api.DiscardResult
		if code != http.StatusOK || json.Unmarshal(b, &res) != nil || !res.Discarded {
			t.Fatalf("discard: %d %s", code, b)
		}
		code, b = post(base+itoa(more.ID)+"/requeue", testToken, ``)
		var rq api.RequeueResult
		if code != http.StatusOK || json.Unmarshal(b, &rq) != nil || rq.Requeued {
			t.Fatalf("requeue of a discarded dead letter: %d %s", code, b)
		}
		var got api.DeadLetterJSON
		h.getJSON(base+itoa(more.ID), &got)
		if got.Resolution != api.ResolutionDiscarded || got.DiscardedAt == nil || got.ResolvedBy != "alice" || got.Note != "a test line" {
			t.Fatalf("discarded dead letter: %s", jsonString(t, got))
		}
		if open := list("?open=true"); len(open) != 2 || open[0].ID != x.ID || open[1].ID != y.ID {
			t.Fatalf("open dead letters %s, want x and y", jsonString(t, open))
		}
	})
	t.Run("RequeueAll", func(t *testing.T) {
		before := h.stats().Applied
		code, b := post("/feeds/ledger/dead-letters/requeue?reason=rejected", testToken, `{"note":"the service is back"}`)
		var res api.RequeueAllResult
		if code != http.StatusOK || json.Unmarshal(b, &res) != nil || res.Requeued != 2 || res.Failed != 0 || res.Next != nil {
			t.Fatalf("requeue all: %d %s", code, b)
		}
		if got := h.stats().Applied; got != before+2 {
			t.Fatalf("applied %d, want %d", got, before+2)
		}
		code, b = post("/feeds/ledger/dead-letters/requeue?reason=rejected", testToken, ``)
		if code != http.StatusOK || json.Unmarshal(b, &res) != nil || res.Requeued != 0 {
			t.Fatalf("requeue all again: %d %s", code, b)
		}
		if open := list("?open=true"); len(open) != 0 {
			t.Fatalf("open dead letters left: %s", jsonString(t, open))
		}
	})
}

func TestParseTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ops.token")
	if err := os.WriteFile(file, []byte("  file-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	toks, err := api.ParseTokens("admin-secret-0123456789", []string{"alice=alice-secret-0123456789", "grafana:read=@" + file},
		os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	want := []api.Token{{"admin", api.RoleAdmin, "admin-secret-0123456789"}, {"alice", api.RoleAdmin, "alice-secret-0123456789"},
		{"grafana", api.RoleRead, "file-secret-0123456789"}}
	if jsonString(t, toks) != jsonString(t, want) {
		t.Fatalf("tokens %s, want %s", jsonString(t, toks), jsonString(t, want))
	}
	for _, c := range []struct {
		specs []string
		err   string
	}{
		{[]string{"alice"}, "want NAME=SECRET"},
		{[]string{"a b=alice-secret-0123456789"}, `token name "a b"`},
		{[]string{"alice:write=alice-secret-0123456789"}, `role "write"`},
		{[]string{"alice=short"}, "5 bytes, want at least 16"},
		{[]string{"alice=@" + filepath.Join(dir, "none")}, "no such file"},
		{[]string{"alice=alice-secret-0123456789", "alice=other-secret-0123456789"}, "token alice given twice"},
		{[]string{"alice=alice-secret-0123456789", "bob=alice-secret-0123456789"}, "same secret"},
		{[]string{"admin=other-secret-0123456789"}, "--admin-token-file"},
	} {
		_, err := api.ParseTokens("admin-secret-0123456789", c.specs, os.ReadFile)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("ParseTokens(%q) = %v, want %q", c.specs, err, c.err)
		}
	}
	if _, err := api.ParseTokens("", nil, func(string) ([]byte, error) { return nil, errors.New("unused") }); err != nil {
		t.Fatal(err)
	}
}
