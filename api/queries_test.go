package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// queryServer serves queries over a real store holding three balances.
func queryServer(t *testing.T, lim outbox.QueryLimits, texts ...string) (string, *outbox.Store) {
	t.Helper()
	ctx := context.Background()
	s := openStore(t)
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger_balances VALUES ('l', 'alice', 7, 2), ('l', 'bob', -3, 1), ('l', 'carol', 12, 1)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var qs []*outbox.Query
	for i := 0; i < len(texts); i += 2 {
		q, err := s.PrepareQuery(ctx, texts[i], texts[i+1])
		if err != nil && !errors.Is(err, outbox.ErrQueryNotReady) {
			t.Fatal(err)
		}
		qs = append(qs, q)
	}
	cfg := api.DefaultConfig()
	cfg.Queries, cfg.QueryLimits = qs, lim
	srv, err := api.New(cfg, s, nil, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return newTestServer(t, srv), s
}

var testQueries = []string{
	"balance", `SELECT account, balance FROM ledger_balances WHERE feed = :feed AND account = :account`,
	"all", `SELECT account, balance FROM ledger_balances ORDER BY account`,
	"spin", `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) AS n FROM c`,
	"later", `SELECT v FROM later WHERE k = :k`,
	"pair", `SELECT * FROM pair a, pair b`,
}

func TestServer_Query(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	lim := outbox.QueryLimits{Timeout: 200 * time.Millisecond, MaxRows: 2, MaxBytes: 1 << 20}
	base, store := queryServer(t, lim, testQueries...)
	get := func(path string) (int, string) {
		code, _, b := request(t, base, http.MethodGet, path, "", nil)
		return code, string(b)
	}

	t.Run("OK", func(t *testing.T) {
		code, body := get("/queries/balance?feed=l&account=alice")
		want := `{"query":"balance","columns":["account","balance"],"rows":[{"account":"alice","balance":7}]}` + "\n"
		if code != 200 || body != want {
			t.Fatalf("%d %s, want 200 %s", code, body, want)
		}
		code, body = get("/queries/balance?feed=l&account=nobody")
		if want := `{"query":"balance","columns":["account","balance"],"rows":[]}` + "\n"; code != 200 || body != want {
			t.Fatalf("%d %s, want 200 %s", code, body, want)
		}
	})

	t.Run("List", func(t *testing.T) {
		code, body := get("/queries")
		want := `{"queries":[{"name":"balance","params":["feed","account"]},{"name":"all","params":[]},` +
			`{"name":"spin","params":[]},{"name":"later","params":["k"]},{"name":"pair","params":[]}],"timeoutMillis":200,"maxRows":2,"maxBytes":1048576}` + "\n"
		if code != 200 || body != want {
			t.Fatalf("%d %s\nwant 200 %s", code, body, want)
		}
	})

	t.Run("Truncated", func(t *testing.T) {
		code, body := get("/queries/all")
		want := `{"query":"all","columns":["account","balance"],"truncated":"rows","rows":[{"account":"alice","balance":7},{"account":"bob","balance":-3}]}` + "\n"
		if code != 200 || body != want {
			t.Fatalf("%d %s\nwant 200 %s", code, body, want)
		}
	})

	t.Run("BadParams", func(t *testing.T) {
		for path, msg := range map[string]string{
			"/queries/balance?feed=l":                         "query balance: missing parameter account",
			"/queries/balance?feed=l&account=a&acount=b":      "query balance: unknown parameter acount",
			"/queries/balance?feed=l&feed=m&account=a":        "query balance: given more than once parameter feed",
			"/queries/all?x=1&y=2":                            "query all: unknown parameter x, y",
			"/queries/balance?feed=l&account=%zz":             `query balance: the query string: invalid URL escape "%zz"`,
			"/queries/balance?account=a&feed=l&x=1&account=b": "query balance: unknown parameter x; given more than once parameter account",
		} {
			code, _, b := request(t, base, http.MethodGet, path, "", nil)
			wantError(t, path, code, b, 400, api.CodeBadRequest)
			if got := errorMessage(t, b); got != msg {
				t.Errorf("%s: message %q, want %q", path, got, msg)
			}
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		code, _, b := request(t, base, http.MethodGet, "/queries/nope", "", nil)
		wantError(t, "unknown query", code, b, 404, api.CodeNotFound)
	})

	t.Run("Timeout", func(t *testing.T) {
		start := time.Now()
		code, _, b := request(t, base, http.MethodGet, "/queries/spin", "", nil)
		wantError(t, "spin", code, b, 504, api.CodeQueryTimeout)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("answered after %v with a 200ms limit", d)
		}
	})

	t.Run("NotReadyThenReady", func(t *testing.T) {
		code, h, b := request(t, base, http.MethodGet, "/queries/later?k=a", "", nil)
		wantError(t, "later", code, b, 503, api.CodeQueryNotReady)
		if h.Get("Retry-After") != "1" {
			t.Fatalf("Retry-After %q", h.Get("Retry-After"))
		}
		ctx := context.Background()
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE later (k TEXT PRIMARY KEY, v INTEGER)`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO later VALUES ('a', 5)`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if code, body := get("/queries/later?k=a"); code != 200 || body != `{"query":"later","columns":["v"],"rows":[{"v":5}]}`+"\n" {
			t.Fatalf("%d %s", code, body)
		}
	})

	// A query that waited for its table, refused once the table is
	// there: it answers what the check says, never runs.
	t.Run("NotReadyThenRefused", func(t *testing.T) {
		code, _, b := request(t, base, http.MethodGet, "/queries/pair", "", nil)
		wantError(t, "pair", code, b, 503, api.CodeQueryNotReady)
		ctx := context.Background()
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE pair (k TEXT)`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		code, _, b = request(t, base, http.MethodGet, "/queries/pair", "", nil)
		wantError(t, "pair", code, b, 500, api.CodeQueryRefused)
		if msg := errorMessage(t, b); msg != `query pair: refused: two result columns are named "k" (name each with AS) (the configuration must change: a start refuses this query)` {
			t.Fatalf("message %q", msg)
		}
	})

	// Many clients at once: each answer is whole and right, or 503 busy
	// after waiting its turn; none waits past the limit.
	t.Run("Concurrent", func(t *testing.T) {
		want := `{"query":"balance","columns":["account","balance"],"rows":[{"account":"carol","balance":12}]}` + "\n"
		var wg sync.WaitGroup
		errs := make(chan string, 400)
		for range 20 {
			wg.Go(func() {
				for range 20 {
					code, _, b := request(t, base, http.MethodGet, "/queries/balance?feed=l&account=carol", "", nil)
					if !(code == 200 && string(b) == want) && code != 503 {
						errs <- string(b)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatalf("a concurrent answer: %s", e)
		}
	})
}

func TestServer_QueryBytesLimit(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	row := len(`{"account":"alice","balance":7}`) + len(`{"account":"bob","balance":-3}`)
	base, _ := queryServer(t, outbox.QueryLimits{MaxBytes: row}, testQueries[2], testQueries[3])
	code, _, b := request(t, base, http.MethodGet, "/queries/all", "", nil)
	want := `{"query":"all","columns":["account","balance"],"truncated":"bytes","rows":[{"account":"alice","balance":7},{"account":"bob","balance":-3}]}` + "\n"
	if code != 200 || string(b) != want {
		t.Fatalf("%d %s\nwant 200 %s", code, b, want)
	}
}

func errorMessage(t *testing.T, b []byte) string {
	t.Helper()
	var e api.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	return e.Error.Message
}

// runawayQuery's first row is quick and its second never comes: x < :n
// compares an integer with text (a parameter is bound as text), which
// holds for every x.
const runawayQuery = `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < :n)
SELECT x FROM c WHERE x = 1 OR x = 0`

// readiness reads /readyz and returns its status and its "queries" check.
func queriesReadiness(t *testing.T, base string) (int, api.Check) {
	t.Helper()
	code, _, b := request(t, base, http.MethodGet, "/readyz", "", nil)
	var rd api.Readiness
	if err := json.Unmarshal(b, &rd); err != nil {
		t.Fatalf("/readyz %s: %v", b, err)
	}
	for _, c := range rd.Checks {
		if c.Name == "queries" {
			return code, c
		}
	}
	t.Fatalf("/readyz has no queries check: %s", b)
	return 0, api.Check{}
}

// TestServer_QueryRunaway: runaway queries, as many as run at once, end
// at their time limit on a later row (504), or when their clients
// disconnect; then a quick query answers at once, not 503, and /readyz
// says no query is running.
func TestServer_QueryRunaway(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	quick := func(t *testing.T, base string) {
		t.Helper()
		code, _, b := request(t, base, http.MethodGet, "/queries/one", "", nil)
		if want := `{"query":"one","columns":["one"],"rows":[{"one":1}]}` + "\n"; code != 200 || string(b) != want {
			t.Fatalf("one: %d %s, want 200 %s", code, b, want)
		}
		wait(t, 10*time.Second, func() error {
			if code, c := queriesReadiness(t, base); code != 200 || c != (api.Check{Name: "queries", OK: true, Message: "0 of 3 running"}) {
				return fmt.Errorf("/readyz %d %+v", code, c)
			}
			return nil
		})
	}
	within := func(t *testing.T, d time.Duration, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		select {
		case <-done:
		case <-time.After(d):
			t.Fatalf("not done after %v: a runaway query was not interrupted", d)
		}
	}

	t.Run("TimeLimit", func(t *testing.T) {
		base, _ := queryServer(t, outbox.QueryLimits{Timeout: 200 * time.Millisecond},
			"runaway", runawayQuery, "one", `SELECT 1 AS one`)
		for round := range 3 {
			within(t, 30*time.Second, func() {
				var wg sync.WaitGroup
				for range api.QueryConcurrency {
					wg.Go(func() {
						code, _, b := request(t, base, http.MethodGet, "/queries/runaway?n=5", "", nil)
						if code != 504 || errorMessage(t, b) != "query runaway: ran past its time limit (200ms)" {
							t.Errorf("round %d: %d %s, want 504", round, code, b)
						}
					})
				}
				wg.Wait()
			})
			within(t, 30*time.Second, func() { quick(t, base) })
		}
	})

	t.Run("ClientGone", func(t *testing.T) {
		base, _ := queryServer(t, outbox.QueryLimits{Timeout: time.Hour},
			"runaway", runawayQuery, "one", `SELECT 1 AS one`)
		within(t, 30*time.Second, func() {
			var wg sync.WaitGroup
			for range api.QueryConcurrency {
				wg.Go(func() {
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/queries/runaway?n=5", nil)
					time.AfterFunc(300*time.Millisecond, cancel)
					if res, err := http.DefaultClient.Do(req); err == nil {
						res.Body.Close()
						t.Errorf("an answer %d to a client that left", res.StatusCode)
					}
				})
			}
			wg.Wait()
			quick(t, base)
		})
	})
}
