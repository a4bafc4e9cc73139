package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// With every turn taken, a dead-letter request waits its bound, then is
// answered 503 busy with Retry-After; once a turn is free, it is served.
func TestDeadLetters_Busy(t *testing.T) {
	ctx := context.Background()
	store, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(t.TempDir(), "t.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.AdminToken = "internal-test-token-0123456789"
	srv, err := New(cfg, store, nil, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv.deadLetterWait = 50 * time.Millisecond
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	var taken [][]byte
	for range DeadLetterConcurrency {
		taken = append(taken, <-srv.deadLetterTurns)
	}
	for _, path := range []string{"/feeds/f/dead-letters", "/feeds/f/dead-letters/1/payload"} {
		res, err := get(ts.URL+path, cfg.AdminToken)
		if err != nil {
			t.Fatal(err)
		}
		var e ErrorBody
		err = json.NewDecoder(res.Body).Decode(&e)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusServiceUnavailable || e.Error.Code != CodeBusy || res.Header.Get("Retry-After") != "1" {
			t.Fatalf("GET %s with every turn taken: %d %+v (Retry-After %q), want 503 busy", path, res.StatusCode, e, res.Header.Get("Retry-After"))
		}
	}
	srv.deadLetterDone(taken[0])
	res, err := get(ts.URL+"/feeds/f/dead-letters", cfg.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != "{\"feed\":\"f\",\"deadLetters\":[],\"next\":null}\n" {
		t.Fatalf("GET with a turn free: %d %s", res.StatusCode, b)
	}
}

// get GETs url with the bearer token.
func get(url, token string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return http.DefaultClient.Do(req)
}
