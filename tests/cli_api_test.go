package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
)

// cli runs the built binary's command with args against the server at
// base and returns its stdout, stderr and exit code.
func cli(t *testing.T, base string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(serverBin, append(args, "--url", base)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %v: %v", args, err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// cliOK is cli wanting exit code 0.
func cliOK(t *testing.T, base string, env []string, args ...string) string {
	t.Helper()
	out, errOut, code := cli(t, base, env, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

// TestCLI_APICommands runs status, dead-letters, losses and topics of the
// built binary against a running server, as an operator would: a read
// token lists and shows, an admin token requeues (with an edited payload),
// discards and acknowledges, each recorded under the token's name.
func TestCLI_APICommands(t *testing.T) {
	dir := t.TempDir()
	input, failFlag := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "fail-commits")
	writeFile(t, input, "acct-1,10\njunk\nacct-2,5\n")
	broker := startBroker(t)
	addr := "127.0.0.1:" + freePort(t)
	base := "http://" + addr
	const opsToken, viewerToken = "ops-token-0123456789abcdef", "viewer-token-0123456789abc"
	start(t, []string{"OUTBOXD_TEST_FAIL_COMMITS=" + failFlag},
		"--db", filepath.Join(dir, "outboxd.db"), "--brokers", broker, "--http", addr,
		"--api-token", "ops="+opsToken+",viewer:read="+viewerToken,
		"--feed", "ledger=file:"+input, "--processor", "ledger=ledger", "--on-completion-failure", "ledger=skip",
		"--feed", "copy=kafka:ledger.out")
	wait(t, 30*time.Second, func() error { return httpOK(base + "/readyz") })
	viewer, ops := []string{"OUTBOXD_TOKEN=" + viewerToken}, []string{"OUTBOXD_TOKEN=" + opsToken}
	feed := func(name string) api.FeedStatus {
		t.Helper()
		var ov api.Overview
		if err := json.Unmarshal([]byte(cliOK(t, base, nil, "status", "--json")), &ov); err != nil {
			t.Fatal(err)
		}
		for _, fs := range ov.Feeds {
			if fs.Feed == name {
				return fs
			}
		}
		t.Fatalf("no feed %s in the status", name)
		return api.FeedStatus{}
	}
	waitApplied := func(name string, n int64) {
		t.Helper()
		wait(t, 30*time.Second, func() error {
			if fs := feed(name); fs.Applied != n || fs.Lag != 0 {
				return fmt.Errorf("feed %s applied %d, lag %d; want %d, 0", name, fs.Applied, fs.Lag, n)
			}
			return nil
		})
	}
	waitApplied("ledger", 2)
	waitApplied("copy", 2)

	t.Run("Status", func(t *testing.T) {
		out := cliOK(t, base, nil, "status")
		lines := strings.Split(out, "\n")
		if lines[0] != "WARNING: 1 dead letter of feed ledger in the last hour, not resolved" {
			t.Fatalf("first line %q", lines[0])
		}
		row := regexp.MustCompile(`(?m)^ledger +caught-up +24/24 +0 bytes +2 +1 +yes +0 pending$`)
		if !row.MatchString(out) || !regexp.MustCompile(`(?m)^copy +caught-up +2/2 +0 records +2 +0 +yes `).MatchString(out) {
			t.Fatalf("status:\n%s", out)
		}
	})
	t.Run("DeadLetters", func(t *testing.T) {
		if _, errOut, code := cli(t, base, nil, "dead-letters", "list", "ledger"); code != 1 || !strings.Contains(errOut, "(HTTP 401, unauthorized)") {
			t.Fatalf("list without a token: exit %d, %s", code, errOut)
		}
		out := cliOK(t, base, viewer, "dead-letters", "list", "ledger")
		if !regexp.MustCompile(`(?m)^1 +malformed +open +\S+ \S+ +0:15 +1 +"junk"$`).MatchString(out) || !strings.HasSuffix(out, "\n1 dead letters\n") {
			t.Fatalf("list:\n%s", out)
		}
		if out := cliOK(t, base, viewer, "dead-letters", "show", "ledger", "1", "--payload"); out != "junk" {
			t.Fatalf("payload %q", out)
		}
		if _, errOut, code := cli(t, base, viewer, "dead-letters", "requeue", "ledger", "1", "--payload", "acct-3,7"); code != 1 || !strings.Contains(errOut, "token viewer may only read") {
			t.Fatalf("requeue with a read token: exit %d, %s", code, errOut)
		}
		out = cliOK(t, base, ops, "dead-letters", "requeue", "ledger", "1", "--payload", "acct-3,7", "--note", "a typo")
		if out != "dead letter 1 of ledger: applied with the edited payload\n" {
			t.Fatalf("requeue: %q", out)
		}
		waitApplied("ledger", 3)
		waitApplied("copy", 3) // the edited line's output, published once
		out = cliOK(t, base, viewer, "dead-letters", "show", "ledger", "1")
		if !strings.Contains(out, "resolution: requeued by ops: a typo (with an edited payload)") || !strings.HasSuffix(out, "payload:    4 bytes\n\"junk\"\n") {
			t.Fatalf("show:\n%s", out)
		}

		appendFile(t, input, "junk2\njunk3\n")
		wait(t, 30*time.Second, func() error {
			if n := feed("ledger").DeadLettered; n != 3 {
				return fmt.Errorf("%d dead letters, want 3", n)
			}
			return nil
		})
		if _, errOut, code := cli(t, base, ops, "dead-letters", "discard", "ledger", "2"); code != 2 || !strings.Contains(errOut, "--note WHY is required") {
			t.Fatalf("discard without a note: exit %d, %s", code, errOut)
		}
		if out := cliOK(t, base, ops, "dead-letters", "discard", "ledger", "2", "--note", "test data"); out != "dead letter 2 of ledger: discarded\n" {
			t.Fatalf("discard: %q", out)
		}
		out = cliOK(t, base, ops, "dead-letters", "requeue", "ledger", "--reason", "malformed")
		if !strings.HasPrefix(out, "malformed dead letters of ledger: 0 requeued, 1 failed again (they stay open)\n  3: ") {
			t.Fatalf("requeue of a reason: %q", out)
		}
		out = cliOK(t, base, viewer, "dead-letters", "list", "ledger", "--open")
		if !regexp.MustCompile(`(?m)^3 +malformed +open `).MatchString(out) || !strings.HasSuffix(out, "\n1 dead letters\n") {
			t.Fatalf("open dead letters:\n%s", out)
		}
		if out := cliOK(t, base, ops, "dead-letters", "discard", "ledger", "--reason", "malformed", "--note", "not ledger lines"); out != "malformed dead letters of ledger: 1 discarded\n" {
			t.Fatalf("discard of a reason: %q", out)
		}
	})
	t.Run("Losses", func(t *testing.T) {
		// Every try of the next batch fails: a completion failure, skipped.
		writeFile(t, failFlag, "5")
		appendFile(t, input, "acct-4,1\n")
		wait(t, 30*time.Second, func() error {
			if feed("ledger").Lossless {
				return errors.New("still lossless")
			}
			return nil
		})
		out := cliOK(t, base, nil, "status")
		if !strings.HasPrefix(out, "CRITICAL: feed ledger is NOT LOSSLESS: 1 losses not acknowledged, the latest completion failure skipped") ||
			!strings.Contains(out, "  what to do: find the lost input") {
			t.Fatalf("status with a loss:\n%s", out)
		}
		if _, errOut, code := cli(t, base, ops, "losses", "ack", "ledger"); code != 2 || !strings.Contains(errOut, "--reason WHY is required") {
			t.Fatalf("ack without a reason: exit %d, %s", code, errOut)
		}
		if out := cliOK(t, base, ops, "losses", "ack", "ledger", "--reason", "re-sent by the upstream"); out != "1 losses of ledger acknowledged by ops: lossless again\n" {
			t.Fatalf("ack: %q", out)
		}
		out = cliOK(t, base, nil, "losses", "list", "ledger")
		if !strings.HasPrefix(out, "ledger: lossless, 1 losses\n") || !strings.Contains(out, "by ops: re-sent by the upstream\n") {
			t.Fatalf("losses:\n%s", out)
		}
		if out := cliOK(t, base, nil, "status"); !strings.HasPrefix(out, "OK: healthy") {
			t.Fatalf("status once resolved:\n%s", out)
		}
	})
	t.Run("Topics", func(t *testing.T) {
		out := cliOK(t, base, nil, "topics")
		if !regexp.MustCompile(`(?m)^ledger\.out +\d+ +input of copy, outputs of ledger$`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^ledger\.dlq +\d+ +dead letters of ledger$`).MatchString(out) {
			t.Fatalf("topics:\n%s", out)
		}
		var d api.KafkaTopicDetail
		if err := json.Unmarshal([]byte(cliOK(t, base, nil, "topics", "describe", "ledger.out", "--json", "--group", "nobody")), &d); err != nil {
			t.Fatal(err)
		}
		// The stored positions are the copy feed's; an end is the high
		// watermark, past the last record by its transaction's marker.
		stored := map[int32]int64{}
		for _, p := range feed("copy").Partitions {
			stored[p.Partition] = p.Position
		}
		for _, p := range d.Partitions {
			if len(p.Positions) != 1 || p.Positions[0].Feed != "copy" || p.Positions[0].Position != stored[p.Partition] ||
				p.Positions[0].Lag != p.End-stored[p.Partition] || p.End < stored[p.Partition] || p.End > stored[p.Partition]+1 {
				t.Fatalf("partition %d: end %d, positions %+v; the copy feed stored %d", p.Partition, p.End, p.Positions, stored[p.Partition])
			}
			if len(p.Groups) != 2 || p.Groups[0].Group != "outboxd-copy" || p.Groups[1].Group != "nobody" || p.Groups[1].Committed != nil ||
				p.Groups[1].Lag != p.End-p.Start {
				t.Fatalf("groups of partition %d: %+v", p.Partition, p.Groups)
			}
		}
		out = cliOK(t, base, nil, "topics", "describe", "ledger.out")
		if !strings.Contains(out, "topic ledger.out (input of copy, outputs of ledger)\n") || !strings.Contains(out, "outboxd-copy COMMITTED") || !strings.Contains(out, "copy POSITION") {
			t.Fatalf("describe:\n%s", out)
		}
		if _, errOut, code := cli(t, base, nil, "topics", "describe", "nope"); code != 1 || !strings.Contains(errOut, "no topic nope") {
			t.Fatalf("describe of an unknown topic: exit %d, %s", code, errOut)
		}
	})
	t.Run("BadUsage", func(t *testing.T) {
		for _, args := range [][]string{{"dead-letters"}, {"dead-letters", "frob"}, {"dead-letters", "show", "ledger", "x"},
			{"status", "--bogus"}, {"losses", "ack"}, {"topics", "describe"}} {
			if out, errOut, code := cli(t, base, nil, args...); code != 2 || out != "" || strings.Count(errOut, "\n") != 1 {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and one line", args, code, out, errOut)
			}
		}
		if _, errOut, code := cli(t, "http://127.0.0.1:1", nil, "status"); code != 1 || !strings.Contains(errOut, "cannot reach the server at http://127.0.0.1:1") {
			t.Errorf("an unreachable server: exit %d, %s", code, errOut)
		}
	})
}
