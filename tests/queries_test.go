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
// one line and exit code 2, before the database is touched, whether it
// starts with its verb or hides it after WITH, and whether the table it
// writes exists yet or not (balances does not); the same database then
// starts with the query put right.
func TestQueries_BadConfiguration(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "outboxd.yaml")
	db := filepath.Join(dir, "outboxd.db")
	for query, want := range map[string]string{
		"DELETE FROM outbox":                        "server: --config " + cfg + ": line 2: queries.wipe: refused: starts with DELETE: a query is a SELECT, VALUES or WITH ... SELECT (see server -h)\n",
		"WITH x AS (SELECT 1) DELETE FROM balances": "server: --config " + cfg + ": line 2: queries.wipe: refused: WITH ... DELETE: a query is a SELECT, VALUES or WITH ... SELECT (see server -h)\n",
	} {
		if err := os.WriteFile(cfg, []byte("queries:\n  wipe: "+query+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(serverBin, "--config", cfg, "--db", db, "--relay", "none")
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || string(out) != want {
			t.Fatalf("%s: exit %d, %q; want 2, %q", query, cmd.ProcessState.ExitCode(), out, want)
		}
		if _, err := os.Stat(db); !os.IsNotExist(err) {
			t.Fatalf("%s: the refused start made %s (%v)", query, db, err)
		}
	}
	if err := os.WriteFile(cfg, []byte("queries:\n  wipe: SELECT count(*) AS n FROM outbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	api := "127.0.0.1:" + freePort(t)
	p := start(t, nil, "--config", cfg, "--db", db, "--relay", "none", "--http", api)
	wait(t, 30*time.Second, func() error { return httpOK("http://" + api + "/readyz") })
	if code, body := httpGet(t, "http://"+api+"/queries/wipe"); code != 200 || body != `{"query":"wipe","columns":["n"],"rows":[{"n":0}]}`+"\n" {
		t.Fatalf("the query put right: %d %s", code, body)
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
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

// cpuSeconds is the process's user and system CPU time so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's name (which may hold spaces) in
	// parentheses; utime and stime are the 14th and 15th of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var utime, stime float64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return (utime + stime) / 100 // clock ticks: 100 a second on Linux
}

// TestQueries_RunawayLaterRow runs, against the server binary, queries
// whose first row is quick and whose second never comes (x < :n compares
// an integer with text: always true), as many as run at once: under the
// time limit each answers 504; with a long limit, clients that disconnect
// end theirs. After each round a quick query answers 200 (not 503 busy),
// /readyz is 200 with no query running, and the server burns no CPU
// (a statement left running would take a core).
func TestQueries_RunawayLaterRow(t *testing.T) {
	const runaway = `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < :n) SELECT x FROM c WHERE x = 1 OR x = 0`
	for _, tc := range []struct {
		name, timeout string
		leave         bool
	}{{"TimeLimit", "300ms", false}, {"ClientsLeave", "1h", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "outboxd.yaml")
			yaml := "queries:\n  runaway: \"" + runaway + "\"\n  one: \"SELECT 1 AS one\"\n"
			if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			api := "127.0.0.1:" + freePort(t)
			p := start(t, nil, "--config", cfg, "--db", filepath.Join(dir, "outboxd.db"), "--http", api, "--relay", "none",
				"--query-timeout", tc.timeout)
			base := "http://" + api
			wait(t, 30*time.Second, func() error { return httpOK(base + "/healthz") })
			const atOnce = 3 // api.QueryConcurrency
			for round := range 3 {
				answers := make(chan string, atOnce)
				for range atOnce {
					go func() {
						client := &http.Client{}
						if tc.leave {
							client.Timeout = 500 * time.Millisecond // the client gives up and disconnects
						}
						res, err := client.Get(base + "/queries/runaway?n=5")
						if err != nil {
							answers <- "gone"
							return
						}
						defer res.Body.Close()
						b, _ := io.ReadAll(res.Body)
						answers <- fmt.Sprintf("%d %s", res.StatusCode, b)
					}()
				}
				want := `504 {"error":{"code":"query_timeout","message":"query runaway: ran past its time limit (300ms)"}}` + "\n"
				if tc.leave {
					want = "gone"
				}
				for range atOnce {
					select {
					case got := <-answers:
						if got != want {
							t.Fatalf("round %d: %q, want %q", round, got, want)
						}
					case <-time.After(60 * time.Second):
						t.Fatalf("round %d: a runaway query still runs after 60s", round)
					}
				}
				// The quick query waits for a turn no longer than the limit:
				// with every turn held for ever it would be 503 (or, under
				// the 1h limit, no answer for an hour).
				done := make(chan string, 1)
				go func() {
					res, err := http.Get(base + "/queries/one")
					if err != nil {
						done <- err.Error()
						return
					}
					defer res.Body.Close()
					b, _ := io.ReadAll(res.Body)
					done <- fmt.Sprintf("%d %s", res.StatusCode, b)
				}()
				select {
				case got := <-done:
					if want := `200 {"query":"one","columns":["one"],"rows":[{"one":1}]}` + "\n"; got != want {
						t.Fatalf("round %d: one: %q, want %q", round, got, want)
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("round %d: a quick query waits for a turn after 60s", round)
				}
				wait(t, 30*time.Second, func() error {
					var rd struct {
						Ready  bool
						Checks []struct {
							Name, Message string
							OK            bool
						}
					}
					if err := getJSON(base+"/readyz", &rd); err != nil || !rd.Ready {
						return fmt.Errorf("/readyz: %+v, %v", rd, err)
					}
					for _, c := range rd.Checks {
						if c.Name == "queries" && c.OK && c.Message == "0 of 3 running" {
							return nil
						}
					}
					return fmt.Errorf("/readyz: %+v, want queries ok and 0 of 3 running", rd.Checks)
				})
				// No statement is left stepping: the server is idle.
				before := cpuSeconds(t, p.cmd.Process.Pid)
				time.Sleep(time.Second) // a span to measure CPU over, not a wait for a condition
				if used := cpuSeconds(t, p.cmd.Process.Pid) - before; used > 0.5 {
					t.Fatalf("round %d: the server used %.2fs of CPU in the idle second after the queries ended", round, used)
				}
			}
			if code := p.stop(t, 30*time.Second); code != 0 {
				t.Fatalf("exit code %d after SIGTERM, want 0", code)
			}
		})
	}
}
