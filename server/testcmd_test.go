package server

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runTest runs the test command on a test file holding yml, written
// beside a configuration holding config (when not ""), and returns its
// exit code, stdout and stderr.
func runTest(t *testing.T, config, yml string, args ...string) (int, string, string) {
	t.Helper()
	dir := t.TempDir()
	if config != "" {
		if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "x.test.yaml")
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := testCommand(context.Background(), append([]string{path}, args...), &stdout, &stderr)
	return code, strings.ReplaceAll(stdout.String(), path, "T"), strings.ReplaceAll(stderr.String(), path, "T")
}

const balancesTest = `config: c.yaml
tests:
  - name: three lines and a bad one
    input: |
      alice,10
      bob,5
      alice,-3
      ,1
    outputs:
      - {topic: payments.out, key: alice, value: '{"account":"alice","balance":10,"position":9}'}
      - {topic: payments.out, key: bob, value: '{"account":"bob","balance":5,"position":15}'}
      - {topic: payments.out, key: alice, value: '{"account":"alice","balance":7,"position":24}'}
    deadLetters:
      - {line: 4, reason: malformed, error: rejected by the reject statement}
    state:
      balances:
        - {account: alice, balance: 7}
        - {account: bob, balance: 5}
`

// TestTestCommand_SQL: a SQL processor's test passes when its outputs,
// dead letters and state are the expected ones, and every difference is
// printed (exit 1) when they are not.
func TestTestCommand_SQL(t *testing.T) {
	cfg := balancesYAML("/nowhere.csv", "")
	t.Run("Pass", func(t *testing.T) {
		code, out, errs := runTest(t, cfg, balancesTest)
		want := "ok   T: three lines and a bad one (3 outputs, 1 dead letters)\n1 tests: 1 passed, 0 failed\n"
		if code != TestPassed || out != want || errs != "" {
			t.Fatalf("exit %d, stdout\n%s\nstderr %q\nwant 0 and\n%s", code, out, errs, want)
		}
	})
	t.Run("Differs", func(t *testing.T) {
		bad := strings.NewReplacer(`"balance":7`, `"balance":8`, "line: 4", "line: 3", "balance: 5}", "balance: 6}").Replace(balancesTest) +
			"  - name: none\n    input: \"zed,1\\n\"\n    outputs: []\n"
		code, out, _ := runTest(t, cfg, bad)
		want := "FAIL T: three lines and a bad one (3 outputs, 1 dead letters)\n" +
			"  outputs[2] (position 24):\n" +
			`    expected payments.out key "alice" value "{\"account\":\"alice\",\"balance\":8,\"position\":24}"` + "\n" +
			`    got      payments.out key "alice" value "{\"account\":\"alice\",\"balance\":7,\"position\":24}"` + "\n" +
			"  deadLetters[0]:\n" +
			`    expected line 3 reason malformed error "rejected by the reject statement"` + "\n" +
			`    got      line 4 reason malformed error "rejected by the reject statement"` + "\n" +
			`  state balances: missing    row account="bob", balance=6` + "\n" +
			`  state balances: unexpected row account="bob", balance=5` + "\n" +
			"FAIL T: none (1 outputs, 0 dead letters)\n" +
			"  outputs: 0 expected, 1 got\n" +
			`  outputs[0]: unexpected payments.out key "zed" value "{\"account\":\"zed\",\"balance\":1,\"position\":6}" (position 6)` + "\n" +
			"2 tests: 0 passed, 2 failed\n"
		if code != TestDiffers || out != want {
			t.Fatalf("exit %d, stdout\n%s\nwant 1 and\n%s", code, out, want)
		}
	})
	t.Run("Run", func(t *testing.T) {
		code, out, _ := runTest(t, cfg, balancesTest, "--run", "nothing like it")
		if code != TestUsage || out != "0 tests: 0 passed, 0 failed\n" {
			t.Fatalf("exit %d, stdout %q", code, out)
		}
	})
}

// TestTestCommand_Go: built-in Go processors are tested alike, headers
// compared when named.
func TestTestCommand_Go(t *testing.T) {
	yml := `processor: ledger
feed: l
tests:
  - name: ledger
    input: "a,1\nb,x\n"
    outputs:
      - {topic: l.out, key: a, value: '{"account":"a","amount":1,"balance":1,"feed":"l","epoch":"test","position":4}'}
    deadLetters:
      - {position: 8, reason: malformed}
    state:
      ledger_balances:
        - {feed: l, account: a, balance: 1}
`
	code, out, errs := runTest(t, "", yml)
	if code != TestPassed || out != "ok   T: ledger (1 outputs, 1 dead letters)\n1 tests: 1 passed, 0 failed\n" || errs != "" {
		t.Fatalf("exit %d, stdout\n%s\nstderr %q", code, out, errs)
	}
	fwd := `processor: forward
topic: copies
kind: kafka
tests:
  - name: headers
    items:
      - {key: k, value: v, headers: {h: "1", other: x}}
    outputs:
      - {topic: copies, key: k, value: v, headers: {h: "2"}}
`
	code, out, errs = runTest(t, "", fwd)
	want := "FAIL T: headers (1 outputs, 0 dead letters)\n  outputs[0] (position 1):\n" +
		`    expected copies key "k" value "v" h="2"` + "\n" + `    got      copies key "k" value "v" h="1"` + "\n" +
		"1 tests: 0 passed, 1 failed\n"
	if code != TestDiffers || out != want || errs != "" {
		t.Fatalf("exit %d, stdout\n%s\nstderr %q\nwant\n%s", code, out, errs, want)
	}
}

// TestTestCommand_Recording: a recording is a test's input, replayed
// from its snapshot through the configuration's processor.
func TestTestCommand_Recording(t *testing.T) {
	yml, _, rec := recordSQL(t, sqlData)
	cfg, err := os.ReadFile(yml)
	if err != nil {
		t.Fatal(err)
	}
	test := "config: c.yaml\ntests:\n  - name: recorded\n    recording: " + rec + "\n" +
		"    deadLetters: [{position: 35, reason: malformed}]\n" +
		"    state:\n      balances: [{account: alice, balance: 7}, {account: bob, balance: 5}, {account: carol, balance: 4}]\n"
	code, out, errs := runTest(t, string(cfg), test)
	if code != TestPassed || out != "ok   T: recorded (4 outputs, 1 dead letters)\n1 tests: 1 passed, 0 failed\n" {
		t.Fatalf("exit %d, stdout\n%s\nstderr %q", code, out, errs)
	}
}

// TestTestCommand_Usage: a bad test file is one line on stderr, exit 2.
func TestTestCommand_Usage(t *testing.T) {
	cfg := balancesYAML("/nowhere.csv", "")
	for _, tc := range []struct{ name, yml, want string }{
		{"UnknownKey", "config: c.yaml\ntests:\n  - name: a\n    input: x\n    outptus: []\n", "field outptus not found"},
		{"NoInput", "config: c.yaml\ntests:\n  - name: a\n", "a: give one of input, inputFile, items or recording"},
		{"TwoInputs", "config: c.yaml\ntests:\n  - name: a\n    input: x\n    items: [{value: v}]\n", "give one of input"},
		{"NoProcessor", "tests:\n  - name: a\n    input: x\n", "give config (a configuration file) or processor"},
		{"UnknownProcessor", "processor: nosuch\ntests:\n  - name: a\n    input: x\n", `unknown processor "nosuch"`},
		{"NoColumn", "config: c.yaml\ntests:\n  - name: a\n    input: \"a,1\\n\"\n    state: {balances: [{acount: a}]}\n", "no column acount"},
		{"DeadLetterAt", "config: c.yaml\ntests:\n  - name: a\n    input: x\n    deadLetters: [{reason: r}]\n", "names its line (from 1) or its position"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := runTest(t, cfg, tc.yml)
			if code != TestUsage || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q: want 2 and one line holding %q", code, errs, tc.want)
			}
		})
	}
}
