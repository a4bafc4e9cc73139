package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// logLine finds the log line whose message is msg and returns it, "" when
// there is none.
func logLine(log, msg string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, " msg="+msg+" ") || strings.HasSuffix(l, " msg="+msg) ||
			strings.Contains(l, ` msg="`+msg) {
			return l
		}
	}
	return ""
}

var levelRE = regexp.MustCompile(` level=(\S+) `)

// levelOf is the level of a text log line.
func levelOf(line string) string {
	if m := levelRE.FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// TestStart_NoFeed: a server started with no feed says so at start, as a
// warning with a --feed example, and runs.
func TestStart_NoFeed(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "outboxd.db")
	p := start(t, nil, "--db", db, "--http", "127.0.0.1:0", "--dev-broker-addr", "127.0.0.1:0")
	if code := p.stop(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	log := p.log.String()
	want := `level=WARN msg="no feeds: the server runs and reads nothing; give one, e.g. server --feed ledger=file:./ledger.csv ` +
		`--processor ledger=ledger (or a feeds: section in the file of --config)"`
	if !strings.Contains(log, want+"\n") {
		t.Fatalf("no line %s in:\n%s", want, log)
	}
	if strings.Index(log, "no feeds:") > strings.Index(log, "outboxd running") {
		t.Fatalf("the no-feed warning comes after the start-up line:\n%s", log)
	}
}

// TestCLI_OwnName: the binary's help and errors use the name it was run
// under; bench's help is in the style of the others; a mistyped command
// or flag is one line naming the closest one, exit code 2.
func TestCLI_OwnName(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "outboxd")
	if err := os.Symlink(serverBin, bin); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Run()
		return cmd.ProcessState.ExitCode(), out.String(), errb.String()
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"consme"}, `outboxd: unknown command "consme" (the closest is consume) (see outboxd -h)`},
		{[]string{"--bach-max", "5"}, `outboxd: unknown flag --bach-max (the closest is --batch-max) (see outboxd -h)`},
		{[]string{"consume", "--topik", "x"}, `outboxd consume: unknown flag --topik (the closest is --topic) (see outboxd consume -h)`},
		{[]string{"bench", "--line", "3"}, `outboxd bench: unknown flag --line (the closest is --lines) (see outboxd bench -h)`},
	} {
		code, out, errOut := run(tc.args...)
		if code != exitConfig || out != "" || errOut != tc.want+"\n" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	code, out, _ := run("-h")
	if code != 0 || !strings.Contains(out, "\n  outboxd consume --topic TOPIC") || !strings.Contains(out, "\n  Example: outboxd --feed ") {
		t.Fatalf("-h: exit %d:\n%s", code, out)
	}
	code, out, _ = run("bench", "-h")
	if code != 0 || !strings.HasPrefix(out, "Usage: outboxd bench [flags]\n") || !strings.Contains(out, "\n  --lines N\n") ||
		!strings.Contains(out, "\nExamples:\n  outboxd bench") {
		t.Fatalf("bench -h: exit %d:\n%s", code, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if goPlaceholderRE.MatchString(l) {
			t.Errorf("bench -h: flag line %q", l)
		}
	}
}

// goPlaceholderRE matches a help's flag line showing the flag package's
// type name instead of a value's name.
var goPlaceholderRE = regexp.MustCompile(`^\s+-?-\S+ (string|int|int64|uint|uint64|float|duration|value)$`)

// TestStart_LogLevels: a first start says at INFO that it runs and that it
// claimed a database no server had, with no warning for a state query
// whose table the processor creates as its feed starts; a shutdown says it
// stopped; a second start claims the database from an older server.
func TestStart_LogLevels(t *testing.T) {
	dir := t.TempDir()
	db, input := filepath.Join(dir, "data", "outboxd.db"), filepath.Join(dir, "ledger.csv")
	writeFile(t, input, "acct-1,10\nacct-2,5\n")
	conf := filepath.Join(dir, "outboxd.yaml")
	// A SQL processor whose setup creates the table the query reads.
	writeFile(t, conf, `processors:
  balances:
    kind: sql
    input: csv
    columns: [account, amount]
    text: [account]
    setup: |
      CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL) STRICT;
    apply: |
      INSERT INTO balances VALUES (:account, :amount)
        ON CONFLICT(account) DO UPDATE SET balance = balance + excluded.balance;
queries:
  balance: SELECT account, balance FROM balances WHERE account = :account
`)
	args := []string{"--config", conf, "--db", db, "--http", "127.0.0.1:0", "--dev-broker-addr", "127.0.0.1:0",
		"--feed", "ledger=file:" + input, "--processor", "ledger=balances"}
	run := func() string {
		t.Helper()
		p := start(t, nil, args...)
		waitPosition(t, db, "ledger", int64(len("acct-1,10\nacct-2,5\n")))
		if code := p.stop(t, 60*time.Second); code != 0 {
			t.Fatalf("exit code %d", code)
		}
		return p.log.String()
	}
	log := run()
	check := func(msg, level string) string {
		t.Helper()
		l := logLine(log, msg)
		if l == "" || levelOf(l) != level {
			t.Fatalf("no %s line %q in:\n%s", level, msg, log)
		}
		return l
	}
	check("outboxd running", "INFO")
	check("database claimed: the first server on it", "INFO")
	check("a state query reads a table its processor creates when its feed starts", "INFO")
	if strings.Contains(log, "fenced") {
		t.Fatalf("a first start speaks of fencing:\n%s", log)
	}
	for _, l := range strings.Split(log, "\n") {
		if levelOf(l) == "WARN" && strings.Contains(l, "query") {
			t.Fatalf("a first start warns of a state query: %s", l)
		}
	}
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	if last := lines[len(lines)-1]; logLine(last, "outboxd stopped") == "" || levelOf(last) != "INFO" {
		t.Fatalf("the last line %q does not say at INFO that outboxd stopped", last)
	}
	log = run()
	check("database claimed: an older server on it, if one still runs, is fenced at its next commit", "INFO")
	if strings.Contains(log, "state query") {
		t.Fatalf("a second start speaks of the state query, whose table exists:\n%s", log)
	}
	check("outboxd stopped", "INFO")
}

// TestCLI_ConsumeProduce runs consume and produce against a running
// server's dev broker: the server's outputs read back as JSON with their
// timestamps and as a format string, records put on a chosen partition
// with a header holding a space, read back from that partition.
func TestCLI_ConsumeProduce(t *testing.T) {
	dir := t.TempDir()
	db, input := filepath.Join(dir, "data", "outboxd.db"), filepath.Join(dir, "ledger.csv")
	writeFile(t, input, "acct-1,10\nacct-2,5\n")
	broker := "127.0.0.1:" + freePort(t)
	p := start(t, nil, "--db", db, "--http", "127.0.0.1:0", "--dev-broker-addr", broker,
		"--feed", "ledger=file:"+input, "--processor", "ledger=ledger")
	waitRelayed(t, db, 2)
	run := func(stdin string, args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(serverBin, append(args, "--brokers", broker)...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, errb.String())
		}
		return out.String(), errb.String()
	}
	out, errOut := run("", "consume", "-t", "ledger.out", "-o", "beginning", "-e", "--format", "json")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if errOut != "2 records\n" || len(lines) != 2 {
		t.Fatalf("consume ledger.out: %s\n%s", errOut, out)
	}
	for _, l := range lines {
		var r struct{ Key, Timestamp string }
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if ts, err := time.Parse(time.RFC3339Nano, r.Timestamp); err != nil || time.Since(ts) > 10*time.Minute {
			t.Fatalf("record %s: timestamp %q (%v)", l, r.Timestamp, err)
		}
	}
	out, _ = run("", "consume", "-t", "ledger.out", "-o", "beginning", "-e", "-f", `%k\n`)
	if got := strings.Fields(out); len(got) != 2 || !slices.Contains(got, "acct-1") || !slices.Contains(got, "acct-2") {
		t.Fatalf("keys %q", out)
	}
	if _, errOut := run("a,1\nb,2\n", "produce", "-t", "extra", "-p", "2", "-H", "note=a b", "--key-field", "1"); errOut != "2 records produced to extra\n" {
		t.Fatalf("produce: %s", errOut)
	}
	out, _ = run("", "consume", "-t", "extra", "-p", "2", "-o", "beginning", "-e")
	if want := "2\t0\ta\ta,1\tnote=\"a b\"\n2\t1\tb\tb,2\tnote=\"a b\"\n"; out != want {
		t.Fatalf("consume extra -p 2:\n%q\nwant\n%q", out, want)
	}
	if out, _ := run("", "consume", "-t", "extra", "-p", "2", "-o", "-1", "-c", "1", "-f", `%o %s\n`); out != "1 b,2\n" {
		t.Fatalf("the last record of partition 2: %q", out)
	}
	if code := p.stop(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}
