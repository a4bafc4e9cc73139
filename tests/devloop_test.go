package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tool runs a subcommand of the built binary and returns its stdout, its
// stderr and its exit code.
func tool(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, serverBin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v: did not finish: %s", args, errb.String())
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// TestDevLoop runs the quick start twice on one database: the dev broker
// keeps its log beside the database, so what the first run published is
// still on the topic in the second, once; produce and consume work against
// it with topics it creates itself.
func TestDevLoop(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "outboxd.db")
	input := filepath.Join(dir, "ledger.csv")
	if err := os.WriteFile(input, []byte("alice,10\nbob,5\nalice,-3\nnot a ledger line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	broker := "127.0.0.1:" + freePort(t)
	api := "127.0.0.1:" + freePort(t)
	run := func() *proc {
		p := start(t, nil, "--db", db, "--http", api, "--dev-broker-addr", broker,
			"--feed", "ledger=file:"+input, "--processor", "ledger=ledger")
		wait(t, 30*time.Second, func() error { return httpOK("http://" + api + "/healthz") })
		return p
	}
	published := func(n int64) { t.Helper(); waitRelayed(t, db, n) }
	p := run()
	published(4) // three outputs and a dead letter
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("first run exited %d", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "devbroker")); err != nil {
		t.Fatalf("the dev broker's data is not beside the database: %v", err)
	}
	p = run()
	appendFile(t, input, "bob,7\n")
	published(5)

	out, stderr, code := tool(t, "", "consume", "--brokers", broker, "--topic", "ledger.out",
		"--from-beginning", "--until-end", "--format", "json")
	if code != 0 || strings.TrimSpace(stderr) != "4 records" {
		t.Fatalf("consume exited %d: %s", code, stderr)
	}
	var balances []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		var v struct {
			Balance int64 `json:"balance"`
		}
		if err := json.Unmarshal([]byte(r.Value), &v); err != nil {
			t.Fatal(err)
		}
		balances = append(balances, fmt.Sprintf("%s=%d", r.Key, v.Balance))
	}
	if got := strings.Join(balances, " "); got != "alice=10 bob=5 alice=7 bob=12" {
		t.Fatalf("outputs across two runs: %s", got)
	}

	_, stderr, code = tool(t, "o-1,placed\no-2,paid\n", "produce", "--brokers", broker, "--topic", "fresh.topic", "--key-field", "1")
	if code != 0 || !strings.Contains(stderr, "2 records produced") {
		t.Fatalf("produce exited %d: %s", code, stderr)
	}
	out, _, code = tool(t, "", "consume", "--brokers", broker, "--topic", "fresh.topic", "--from-beginning", "--until-end")
	if code != 0 || strings.Count(out, "\n") != 2 || !strings.Contains(out, "o-2\to-2,paid") {
		t.Fatalf("consume of a produced topic exited %d:\n%s", code, out)
	}
	if _, stderr, code = tool(t, "", "consume", "--brokers", broker, "--topic", "missing", "--until-end"); code != 1 || !strings.Contains(stderr, "not found") {
		t.Fatalf("consume of a missing topic: exit %d, %s", code, stderr)
	}
	p.stop(t, 30*time.Second)
}

// TestVersion: --version names the module version and the Go version.
func TestVersion(t *testing.T) {
	out, _, code := tool(t, "", "--version")
	if code != 0 || !strings.HasPrefix(out, "outboxd ") || !strings.Contains(out, "go1.") {
		t.Fatalf("--version: exit %d, %q", code, out)
	}
}
