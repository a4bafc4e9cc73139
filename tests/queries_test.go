package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// queriesYAML: a balance by account, and a snapshot of the feed's
// position beside the lines its balances count.
const queriesYAML = `queries:
  balance: "SELECT account, balance, lines FROM ledger_balances WHERE feed = 'ledger' AND account = :account"
  snapshot: |
    SELECT (SELECT position FROM positions WHERE feed = 'ledger') AS position,
           (SELECT coalesce(sum(lines), 0) FROM ledger_balances WHERE feed = 'ledger') AS lines,
           (SELECT coalesce(sum(balance), 0) FROM ledger_balances WHERE feed = 'ledger') AS total
`

// TestQueries_WhileIngesting runs the server binary over a ledger file of
// fixed-width lines while clients query it, killing it with SIGKILL at
// random moments. Every answer is one snapshot: the position and the
// lines and balances it counts come from the same commit (lines = position
// / width, total = lines). After the last run the queries give the exact
// balances.
func TestQueries_WhileIngesting(t *testing.T) {
	const (
		accounts = 50
		lines    = 200000
		width    = len("acct-00,1\n")
	)
	dir := t.TempDir()
	db, input, cfg := filepath.Join(dir, "outboxd.db"), filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "outboxd.yaml")
	var b strings.Builder
	for i := range lines {
		fmt.Fprintf(&b, "acct-%02d,1\n", i%accounts)
	}
	if err := os.WriteFile(input, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(queriesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	api := "127.0.0.1:" + freePort(t)
	args := []string{"--config", cfg, "--db", db, "--http", api, "--relay", "none", "--batch-max", "200",
		"--feed", "ledger=file:" + input, "--processor", "ledger=ledger"}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 15))
	answers, killedAt := 0, []int64{}
	for run := 0; ; run++ {
		p := start(t, nil, args...)
		wait(t, 30*time.Second, func() error { return httpOK("http://" + api + "/healthz") })
		deadline := time.Now().Add(time.Duration(50+rng.IntN(300)) * time.Millisecond) // a random moment to crash at
		if run == 3 {
			deadline = time.Now().Add(90 * time.Second) // the last run reads to the end
		}
		for time.Now().Before(deadline) {
			snap, ok := querySnapshot(t, api)
			if !ok {
				continue // not ready: no position stored yet
			}
			answers++
			if snap.Position%int64(width) != 0 || snap.Lines != snap.Position/int64(width) || snap.Total != snap.Lines {
				t.Fatalf("run %d: a torn snapshot: position %d, lines %d, total %d", run, snap.Position, snap.Lines, snap.Total)
			}
			if run == 3 && snap.Position == int64(lines*width) {
				break
			}
		}
		if run == 3 {
			if snap, _ := querySnapshot(t, api); snap.Position != int64(lines*width) {
				t.Fatalf("the last run stopped at position %d, want %d", snap.Position, lines*width)
			}
			if code := p.stop(t, 30*time.Second); code != 0 {
				t.Fatalf("exit code %d after SIGTERM, want 0", code)
			}
			break
		}
		p.kill()
		snap, _ := querySnapshotAfter(t, db)
		killedAt = append(killedAt, snap)
	}
	p := start(t, nil, args...)
	wait(t, 30*time.Second, func() error { return httpOK("http://" + api + "/healthz") })
	for _, acct := range []string{"acct-00", "acct-49"} {
		code, body := httpGet(t, "http://"+api+"/queries/balance?account="+acct)
		want := fmt.Sprintf(`{"query":"balance","columns":["account","balance","lines"],"rows":[{"account":"%s","balance":%d,"lines":%d}]}`+"\n",
			acct, lines/accounts, lines/accounts)
		if code != 200 || body != want {
			t.Fatalf("GET balance %s: %d %s, want %s", acct, code, body, want)
		}
	}
	code, body := httpGet(t, "http://"+api+"/queries/balance?acount=acct-00")
	if code != 400 || !strings.Contains(body, "unknown parameter acount; missing parameter account") {
		t.Fatalf("a misspelt parameter: %d %s", code, body)
	}
	p.stop(t, 30*time.Second)
	t.Logf("%d consistent snapshots across 4 runs, 3 of them killed at positions %v of %d", answers, killedAt, lines*width)
}

// querySnapshotAfter is the feed's stored position once its server is gone.
func querySnapshotAfter(t *testing.T, db string) (int64, bool) {
	t.Helper()
	pos := storedPosition(t, db, "ledger")
	return pos, pos >= 0
}

type snapshot struct{ Position, Lines, Total int64 }

// querySnapshot asks the snapshot query; false while the feed has stored
// no position yet (a null position).
func querySnapshot(t *testing.T, api string) (snapshot, bool) {
	t.Helper()
	code, body := httpGet(t, "http://"+api+"/queries/snapshot")
	if code != 200 {
		t.Fatalf("GET /queries/snapshot: %d %s", code, body)
	}
	var res struct {
		Rows []struct{ Position, Lines, Total *int64 }
	}
	if err := json.Unmarshal([]byte(body), &res); err != nil || len(res.Rows) != 1 {
		t.Fatalf("snapshot %s: %v", body, err)
	}
	r := res.Rows[0]
	if r.Position == nil {
		return snapshot{}, false
	}
	return snapshot{*r.Position, *r.Lines, *r.Total}, true
}

// TestQueries_BadConfiguration: a query that writes is refused at start,
// one line and exit code 2, before the database is touched.
func TestQueries_BadConfiguration(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(cfg, []byte("queries:\n  wipe: DELETE FROM outbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "outboxd.db")
	cmd := exec.Command(serverBin, "--config", cfg, "--db", db, "--relay", "none")
	out, _ := cmd.CombinedOutput()
	want := "server: --config " + cfg + ": line 2: queries.wipe: refused: starts with DELETE: a query is a SELECT, VALUES or WITH ... SELECT (see server -h)\n"
	if cmd.ProcessState.ExitCode() != 2 || string(out) != want {
		t.Fatalf("exit %d, %q; want 2, %q", cmd.ProcessState.ExitCode(), out, want)
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Fatalf("the refused start made %s (%v)", db, err)
	}
}

// TestQueries_TimeoutsKeepServing: queries past their time limit, as many
// at once as run at once, each answer 504 and give their connection back:
// round after round, every one is interrupted, and a quick query answers
// after each round.
func TestQueries_TimeoutsKeepServing(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "outboxd.yaml")
	yaml := `queries:
  spin: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) AS n FROM c"
  one: "SELECT 1 AS one"
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	api := "127.0.0.1:" + freePort(t)
	p := start(t, nil, "--config", cfg, "--db", filepath.Join(dir, "outboxd.db"), "--http", api, "--relay", "none",
		"--query-timeout", "200ms")
	base := "http://" + api
	wait(t, 30*time.Second, func() error { return httpOK(base + "/healthz") })
	const atOnce = 3 // api.QueryConcurrency
	for round := range 4 {
		codes := make(chan string, atOnce)
		for range atOnce {
			go func() {
				start := time.Now()
				res, err := http.Get(base + "/queries/spin")
				if err != nil {
					codes <- err.Error()
					return
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(res.Body)
				if d := time.Since(start); d > 10*time.Second {
					codes <- fmt.Sprintf("answered after %v", d)
					return
				}
				codes <- fmt.Sprintf("%d %s", res.StatusCode, b)
			}()
		}
		want := `504 {"error":{"code":"query_timeout","message":"query spin: ran past its time limit (200ms)"}}` + "\n"
		for range atOnce {
			if got := <-codes; got != want {
				t.Fatalf("round %d: %q, want %q", round, got, want)
			}
		}
		code, body := httpGet(t, base+"/queries/one")
		if want := `{"query":"one","columns":["one"],"rows":[{"one":1}]}` + "\n"; code != 200 || body != want {
			t.Fatalf("round %d: one: %d %q, want 200 %q", round, code, body, want)
		}
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}
