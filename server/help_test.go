package server

import (
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMain names the program "server" in help and errors, as the binary
// built from cmd/server is named in the tests (a test binary's own name
// is server.test).
func TestMain(m *testing.M) {
	programName = "server"
	os.Exit(m.Run())
}

// command runs the command line args and returns its exit code, standard
// output and standard error.
func command(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb strings.Builder
	code := Command(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestUsage_EveryFlagOnce: every flag of the service is in exactly one
// group of the help, and the groups name no flag there is not.
func TestUsage_EveryFlagOnce(t *testing.T) {
	c := DefaultConfig()
	var p string
	fs := flagSet(&c, &p, &givenSettings{})
	var all []string
	fs.VisitAll(func(f *flag.Flag) { all = append(all, f.Name) })
	grouped := groupedFlags()
	if !slices.Equal(grouped, all) {
		t.Fatalf("flags in the help's groups:\n%v\nthe service's flags:\n%v", grouped, all)
	}
}

// goPlaceholder matches a flag line of a help that shows the flag
// package's type name instead of a value's name.
var goPlaceholder = regexp.MustCompile(`^\s+-?-\S+ (string|int|int64|uint|uint64|float|duration|value)$`)

// shortLong matches a flag's line of a help: --name, or -n, --name.
var shortLong = regexp.MustCompile(`^  (-[a-zA-Z], )?--[a-z]`)

// TestHelp_EveryCommand: the main help lists every subcommand under the
// program's name, and each subcommand's -h prints, in the same style, its
// usage line, its flags as --name VALUE (no Go type placeholders) and an
// example; exit code 0.
func TestHelp_EveryCommand(t *testing.T) {
	code, main, _ := command(t, "-h")
	if code != 0 {
		t.Fatalf("-h: exit %d", code)
	}
	lines := strings.Split(main, "\n")
	for _, want := range []string{
		"Usage:",
		"  server [flags]",
		"  server consume --topic TOPIC [-o beginning|end|N|-N] [-p N] [-c N] [-e] [-f FMT]",
		"  server produce --topic TOPIC [-p N] [-H KEY=VALUE] [--key-json FIELD | --json] < FILE",
		"  server replay RECORDING... [--db OUT] [--diff DB]",
		"  server status [--json]",
		"  server dead-letters list|show|requeue|discard FEED ...",
		"  server losses list|ack FEED [--reason WHY]",
		"  server topics [list | describe TOPIC]",
		"  server bench [--lines N] [--json]",
		"  server config [flags]",
		"Feeds: what to read, and what each item becomes:",
		"Store: the SQLite database, one transaction per batch:",
		"Relay: publishing the outbox to Kafka:",
		"Kafka security: TLS and SASL to the brokers (the relay, Kafka feeds, consume and produce):",
		"HTTP: the API, dashboard, metrics and state queries:",
		"Limits: the backlog while Kafka is away, and the shutdown:",
		"  --feed NAME=file:PATH",
		"  --batch-max N",
		"  Example: server --feed ledger=file:./ledger.csv --processor ledger=ledger --topic ledger=balances",
		"  Example: server --max-backlog-bytes 10GiB --shutdown-grace 30s",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("the main help has no line %q", want)
		}
	}
	// The batch flags in the order their texts read: batch-max first.
	if i, j := strings.Index(main, "  --batch-max N\n"), strings.Index(main, "  --batch-bytes N\n"); i < 0 || j < i {
		t.Errorf("--batch-bytes (%d) before --batch-max (%d)", j, i)
	}
	if strings.Count(main, "  Example: ") != len(flagGroups) {
		t.Errorf("%d examples for %d groups", strings.Count(main, "  Example: "), len(flagGroups))
	}
	for _, args := range [][]string{
		{"consume", "-h"}, {"produce", "--help"}, {"config", "-h"}, {"replay", "-h"}, {"status", "-h"},
		{"dead-letters", "-h"}, {"dead-letters", "list", "-h"}, {"dead-letters", "requeue", "-h"},
		{"losses", "--help"}, {"losses", "ack", "-h"}, {"topics", "-h"}, {"topics", "describe", "-h"},
	} {
		code, out, errOut := command(t, args...)
		if code != 0 || errOut != "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
		if !strings.HasPrefix(out, "Usage: server "+args[0]) {
			t.Errorf("%v: the help does not start with Usage: server %s:\n%s", args, args[0], out)
		}
		if !strings.Contains(out, "\nExamples:\n  server "+args[0]) {
			t.Errorf("%v: no example:\n%s", args, out)
		}
		if args[0] != "config" && !strings.Contains(out, "\nFlags:\n  --") {
			t.Errorf("%v: no flags:\n%s", args, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if goPlaceholder.MatchString(l) || strings.HasPrefix(l, "  -") && !shortLong.MatchString(l) {
				t.Errorf("%v: flag line %q", args, l)
			}
		}
	}
	// A flag's short name is on its line.
	if _, out, _ := command(t, "consume", "-h"); !strings.Contains(out, "\n  -o, --offset OFFSET\n") || strings.Contains(out, "alias") {
		t.Errorf("consume -h:\n%s", out)
	}
	// config takes the service's flags: its help lists them, grouped.
	_, out, _ := command(t, "config", "-h")
	if !strings.Contains(out, "\nStore: the SQLite database, one transaction per batch:\n  --db PATH\n") {
		t.Errorf("config -h lists no flags:\n%s", out)
	}
}

// TestCommand_Mistyped: a mistyped subcommand, sub-subcommand or flag is
// one line naming the closest one, exit code 2.
func TestCommand_Mistyped(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"consme"}, `server: unknown command "consme" (the closest is consume) (see server -h)`},
		{[]string{"stauts", "--json"}, `server: unknown command "stauts" (the closest is status) (see server -h)`},
		{[]string{"--bach-max", "5"}, `server: unknown flag --bach-max (the closest is --batch-max) (see server -h)`},
		{[]string{"consume", "--topik", "x"}, `server consume: unknown flag --topik (the closest is --topic) (see server consume -h)`},
		{[]string{"produce", "--topic", "x", "--jsn"}, `server produce: unknown flag --jsn (the closest is --json) (see server produce -h)`},
		{[]string{"replay", "--dif", "x", "a.rec"}, `server replay: unknown flag --dif (the closest is --diff) (see server replay -h)`},
		{[]string{"config", "--fed", "a=file:x"}, `server: unknown flag --fed (the closest is --feed) (see server -h)`},
		{[]string{"status", "--jsn"}, `server status: unknown flag --jsn (the closest is --json)`},
		{[]string{"dead-letters", "lst", "ledger"}, `server dead-letters: "lst": want list, show, requeue or discard (the closest is list)`},
		{[]string{"dead-letters", "list", "ledger", "--opn"}, `server dead-letters list: unknown flag --opn (the closest is --open)`},
		{[]string{"losses", "akc", "ledger"}, `server losses: "akc": want list or ack (the closest is ack)`},
		{[]string{"topics", "descibe", "t"}, `server topics: "descibe": want list or describe (the closest is describe)`},
	} {
		code, out, errOut := command(t, tc.args...)
		if code != ExitConfig || out != "" || errOut != tc.want+"\n" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}
