package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConfig_FileMistakes starts the binary on configuration files with
// mistakes: each exits 2 with one line naming the file, the line, the key
// and what was wanted, and creates nothing.
func TestConfig_FileMistakes(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "outboxd.db")
	for _, tc := range []struct{ name, yaml, want string }{
		{"UnknownKey", "db: " + db + "\nrelay:\n  mode: none\n  batchs: 5\n",
			"line 4: unknown key relay.batchs (the closest known key is relay.batch)"},
		{"BadValue", "db: " + db + "\nbatchWait: soon\n", `line 2: batchWait: "soon": want a duration such as 500ms, 5s, 2m or 24h`},
		{"BadIndent", "db: " + db + "\nfeeds:\n  ledger:\n    source: file:./ledger.csv\n   processor: ledger\n",
			"line 5: indented by 3 spaces, which matches no key above it (indented by 0, 2, 4) (did not find expected key)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".yaml")
			writeFile(t, path, tc.yaml)
			p, _ := launch(t, nil, "", nil, "--config", path, "--http", "127.0.0.1:0")
			if code := waitExit(t, p, 30*time.Second); code != exitConfig {
				t.Fatalf("exit code %d, want %d", code, exitConfig)
			}
			if line, want := oneLine(t, p), "server: --config "+path+": "+tc.want+" (see server -h)"; line != want {
				t.Fatalf("message\n%q\nwant\n%q", line, want)
			}
			if _, err := os.Stat(filepath.Dir(db)); !os.IsNotExist(err) {
				t.Fatalf("a start with a bad file created %s (%v)", filepath.Dir(db), err)
			}
		})
	}
}

// TestConfig_EveryMistake: a file with several mistakes exits 2 with a
// line for each, in the order of the file, each with its line number.
func TestConfig_EveryMistake(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "outboxd.db")
	path := filepath.Join(dir, "outboxd.yaml")
	writeFile(t, path, "db: "+db+"\nbatchMax: 0\nfeeds:\n  ledger:\n    source: file:./ledger.csv\n    processor: nope\n    onFailure: ignore\nrelay:\n  batchs: 5\n")
	p, _ := launch(t, nil, "", nil, "--config", path, "--http", "127.0.0.1:0")
	if code := waitExit(t, p, 30*time.Second); code != exitConfig {
		t.Fatalf("exit code %d, want %d", code, exitConfig)
	}
	pre := "server: --config " + path + ": "
	want := pre + "line 2: batchMax: 0, want at least 1\n" +
		pre + `line 6: feeds.ledger.processor: unknown processor "nope" (registered: forward, ledger, orders)` + "\n" +
		pre + "line 7: feeds.ledger.onFailure: want dead-letter or stop\n" +
		pre + "line 9: unknown key relay.batchs (the closest known key is relay.batch) (see server -h)\n"
	if got := p.log.String(); got != want {
		t.Fatalf("stderr\n%s\nwant\n%s", got, want)
	}
}

// TestConfig_PrintedRuns prints the configuration that flags and the
// environment make with `server config`, then runs the binary on that file
// alone: it runs the same feed into the same database, and `server config
// --config FILE` prints the same values.
func TestConfig_PrintedRuns(t *testing.T) {
	dir := t.TempDir()
	input, db := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "data", "outboxd.db")
	writeFile(t, input, "acct-1,10\nacct-2,5\n")
	printed := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command(serverBin, append([]string{"config"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("server config %v: %v", args, err)
		}
		return string(out)
	}
	yaml := printed([]string{"OUTBOXD_BATCH_MAX=17", "OUTBOXD_DB=" + db},
		"--feed", "ledger=file:"+input, "--processor", "ledger=ledger", "--relay", "none", "--http", "127.0.0.1:0")
	for _, line := range []string{"batchMax: 17 # from OUTBOXD_BATCH_MAX\n", "    processor: ledger # from --processor\n",
		"  mode: none # from --relay\n"} {
		if !strings.Contains(yaml, line) {
			t.Fatalf("no %q in:\n%s", line, yaml)
		}
	}
	path := filepath.Join(dir, "outboxd.yaml")
	writeFile(t, path, yaml)
	p := start(t, nil, "--config", path)
	waitPosition(t, db, "ledger", int64(len("acct-1,10\nacct-2,5\n")))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	again := printed(nil, "--config", path)
	strip := func(s string) string { // the values, without where they came from
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, "#") {
				out = append(out, strings.SplitN(l, " #", 2)[0])
			}
		}
		return strings.Join(out, "\n")
	}
	if strip(again) != strip(yaml) {
		t.Fatalf("printed from the file:\n%s\nwant the values of:\n%s", again, yaml)
	}
}
