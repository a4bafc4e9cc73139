package tests

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/internal/testutil"
)

// mountTmpfs is testutil.MountTmpfs.
var mountTmpfs = testutil.MountTmpfs

// fillDisk is testutil.FillDisk.
var fillDisk = testutil.FillDisk

// apiAddr is the address the server's log says its API listens on.
func apiAddr(t *testing.T, p *proc) string {
	t.Helper()
	var addr string
	wait(t, 30*time.Second, func() error {
		m := regexp.MustCompile(`HTTP API listening.* addr=(\S+)`).FindStringSubmatch(p.log.String())
		if m == nil {
			return errors.New("the server's log names no HTTP address yet")
		}
		addr = m[1]
		return nil
	})
	return "http://" + addr
}

// getStatus reads a feed's status.
func getStatus(base, feed string) (api.FeedStatus, error) {
	var fs api.FeedStatus
	res, err := http.Get(base + "/feeds/" + feed + "/status")
	if err != nil {
		return fs, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fs, fmt.Errorf("status: %s", res.Status)
	}
	return fs, json.NewDecoder(res.Body).Decode(&fs)
}

// getReadiness reads /readyz.
func getReadiness(base string) (int, api.Readiness, error) {
	var rd api.Readiness
	res, err := http.Get(base + "/readyz")
	if err != nil {
		return 0, rd, err
	}
	defer res.Body.Close()
	return res.StatusCode, rd, json.NewDecoder(res.Body).Decode(&rd)
}

// A disk that fills under a running server stalls the feed, says why, and
// makes the server unready; once space is freed the feed resumes by
// itself, and every line is applied exactly once (under skip: once, or
// inside a recorded loss of exactly its range).
func TestStall_DiskFull(t *testing.T) {
	for _, policy := range []string{"stop", "skip"} {
		t.Run(policy, func(t *testing.T) {
			dir := mountTmpfs(t, "8m")
			var filler string
			stallAndResume(t, dir, policy, stallFault{
				make:  func() { filler = fillDisk(t, dir) },
				clear: func() { must(t, os.Remove(filler)) },
				why:   "disk full",
			})
		})
	}
}

// A database file made immutable under a running server (chattr +i: no
// write reaches it, not even root's) stalls the feed on an I/O error; made
// writable again, the feed resumes by itself, every line applied once.
func TestStall_Immutable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chattr +i needs root: not root")
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	chattr := func(flag string) error {
		out, err := exec.Command("chattr", flag, db, db+"-wal").CombinedOutput()
		if err != nil {
			return fmt.Errorf("chattr %s: %v: %s", flag, err, out)
		}
		return nil
	}
	t.Cleanup(func() { chattr("-i") })
	stallAndResume(t, dir, "stop", stallFault{
		make: func() {
			if err := chattr("+i"); err != nil {
				t.Skipf("this file system cannot make a file immutable: %v", err)
			}
		},
		clear: func() { must(t, chattr("-i")) },
		why:   "disk I/O error",
	})
}

// stallFault is what makes commits fail under a running server, undoes
// it, and the condition the feed's reason must name.
type stallFault struct {
	make, clear func()
	why         string
}

// stallAndResume runs a ledger feed with its database in dir, applies a
// first part of the input, makes the fault and appends the rest: the feed
// must stall with the fault's reason and the server be unready; once the
// fault is cleared, the feed must catch up by itself, the server be ready
// again, and the database hold every line's effects exactly once.
func stallAndResume(t *testing.T, dir, policy string, fault stallFault) {
	db := filepath.Join(dir, "outboxd.db")
	input := filepath.Join(t.TempDir(), "ledger.csv") // the input is on another disk
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	lf := makeLedger(rng, 6000)
	first := lineEnd(lf.data, 1000)
	if err := os.WriteFile(input, lf.data[:first], 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, nil, "--db", db, "--feed", "ledger=file:"+input, "--processor", "ledger=ledger",
		"--on-completion-failure", "ledger="+policy, "--relay", "none", "--http", "127.0.0.1:0")
	base := apiAddr(t, p)
	waitRunning(t, p)
	waitStatus(t, base, 30*time.Second, func(fs api.FeedStatus) error {
		if fs.Position != int64(first) || fs.State != "caught-up" {
			return fmt.Errorf("%s at %d, want caught-up at %d", fs.State, fs.Position, first)
		}
		return nil
	})

	fault.make()
	appendFile(t, input, string(lf.data[first:]))
	why := regexp.MustCompile(`^completion failure: ` + fault.why + `: `)
	if policy == "skip" {
		// A full disk is never skipped: skip waits for space as stop does.
		why = regexp.MustCompile(`^completion failure: ` + fault.why + `: .*; skip never skips for a full disk: it waits for space$`)
	}
	waitStatus(t, base, 60*time.Second, func(fs api.FeedStatus) error {
		if fs.State != "stalled" || !why.MatchString(fs.LastError) {
			return fmt.Errorf("%s (%q) at %d, want stalled: %s", fs.State, fs.LastError, fs.Position, why)
		}
		return nil
	})
	wait(t, 30*time.Second, func() error {
		code, rd, err := getReadiness(base)
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !hasPrefix(rd.Reasons, "database: not writable") ||
			!hasPrefix(rd.Reasons, "feed:ledger: stalled: completion failure: "+fault.why) {
			return fmt.Errorf("readyz %d %q, want 503 naming the database and the feed", code, rd.Reasons)
		}
		return nil
	})
	stalledAt, _ := getStatus(base, "ledger")
	t.Logf("stalled at %d of %d: %s", stalledAt.Position, len(lf.data), stalledAt.LastError)
	// Stalled, not caught up: the lines behind the stall are the lag, and
	// nothing was skipped or counted.
	if stalledAt.State != "stalled" || stalledAt.Lag != stalledAt.End-stalledAt.Position || stalledAt.Lag <= 0 ||
		stalledAt.CompletionFailures != 0 || !stalledAt.Lossless {
		t.Fatalf("while stalled: %+v, want stalled with a lag, no completion failure, lossless", stalledAt)
	}

	fault.clear()
	end := int64(len(lf.data))
	waitStatus(t, base, 90*time.Second, func(fs api.FeedStatus) error {
		if fs.Position != end || fs.State != "caught-up" || fs.LastError != "" {
			return fmt.Errorf("%s (%q) at %d, want caught-up at %d", fs.State, fs.LastError, fs.Position, end)
		}
		return nil
	})
	wait(t, 30*time.Second, func() error {
		if code, rd, err := getReadiness(base); err != nil || code != http.StatusOK {
			return fmt.Errorf("readyz %d %q %v once the fault is gone, want 200", code, rd.Reasons, err)
		}
		return nil
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	checkLedger(t, db, lf, 0) // under skip too: nothing was skipped
}

// must is testutil.Must.
var must = testutil.Must

// lineEnd is the position after the n-th line of data.
func lineEnd(data []byte, n int) int {
	pos := 0
	for range n {
		pos += strings.IndexByte(string(data[pos:]), '\n') + 1
	}
	return pos
}

func hasPrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// waitStatus polls the feed "ledger"'s status until ok accepts it.
func waitStatus(t *testing.T, base string, timeout time.Duration, ok func(api.FeedStatus) error) {
	t.Helper()
	wait(t, timeout, func() error {
		fs, err := getStatus(base, "ledger")
		if err != nil {
			return err
		}
		return ok(fs)
	})
}
