package server

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// ProgramName is the program's own name, as its help and errors say it:
// the base of os.Args[0] ("outboxd", "server", or a program's own built on
// package server).
func ProgramName() string { return programName }

// helpWidth is the column the help's text is wrapped at.
const helpWidth = 80

// goPlaceholders are the flag package's names for a value whose usage
// back-quotes none, and what the help says instead.
var goPlaceholders = map[string]string{
	"string": "TEXT", "int": "N", "int64": "N", "uint": "N", "uint64": "N",
	"float": "X", "duration": "D", "value": "VALUE",
}

// flagHead is a flag as the help shows it, "--name VALUE" (no value for
// a boolean flag), and its text with the default.
func flagHead(f *flag.Flag) (head, text string) {
	name, text := flag.UnquoteUsage(f)
	if p, ok := goPlaceholders[name]; ok {
		name = p
	}
	head = "--" + f.Name
	if name != "" {
		head += " " + name
	}
	if shownDefault(f) && !strings.Contains(text, "(default") {
		text += fmt.Sprintf(" (default %s)", f.DefValue)
	}
	return head, text
}

// shownDefault says whether the help shows a flag's default.
func shownDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "0", "false", "0s", "[]":
		return false
	}
	return true
}

// PrintFlags prints fs's flags named in names (every flag when none) in
// the help's style: "  --name VALUE" then the text, wrapped and indented.
func PrintFlags(w io.Writer, fs *flag.FlagSet, names ...string) {
	if len(names) == 0 {
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	}
	aliases := map[string]string{} // flag -> its short name
	fs.VisitAll(func(f *flag.Flag) {
		if long, ok := strings.CutPrefix(f.Usage, aliasMark); ok {
			aliases[long] = f.Name
		}
	})
	for _, n := range names {
		f := fs.Lookup(n)
		if f == nil || strings.HasPrefix(f.Usage, aliasMark) {
			continue
		}
		head, text := flagHead(f)
		if short, ok := aliases[n]; ok {
			head = "-" + short + ", " + head
		}
		fmt.Fprintf(w, "  %s\n%s", head, wrap(text, "      ", helpWidth))
	}
}

// wrap breaks text into lines of at most width columns (a longer word
// stays whole), each starting with indent and ending with a newline.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(text) {
		if line != indent && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += word
	}
	if line != indent {
		b.WriteString(line + "\n")
	}
	return b.String()
}

// CommandHelp prints a subcommand's help in the style of the server's:
// its usage line (synopsis follows the program's name), what it does, its
// flags and examples (each a command line after the program's name).
func CommandHelp(w io.Writer, synopsis, about string, fs *flag.FlagSet, examples ...string) {
	for i, line := range strings.Split(synopsis, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case i == 0:
			fmt.Fprintf(w, "Usage: %s %s\n", programName, line)
		case strings.HasPrefix(line, "("):
			fmt.Fprintf(w, "       %s\n", line)
		default:
			fmt.Fprintf(w, "       %s %s\n", programName, line)
		}
	}
	fmt.Fprintln(w)
	for _, para := range strings.Split(about, "\n\n") {
		fmt.Fprint(w, wrap(para, "", helpWidth))
		fmt.Fprintln(w)
	}
	if fs != nil && hasFlags(fs) {
		fmt.Fprintln(w, "Flags:")
		PrintFlags(w, fs)
	}
	if len(examples) > 0 {
		if fs != nil && hasFlags(fs) {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "Examples:")
		for _, e := range examples {
			fmt.Fprintf(w, "  %s %s\n", programName, e)
		}
	}
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// commandUsage prints a subcommand's usage error on one line, pointing at
// its help, and returns ExitConfig.
func commandUsage(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s %s: %s (see %s %s -h)\n", programName, cmd, oneLine(err.Error()), programName, cmd)
	return ExitConfig
}

// FlagError turns the flag package's error for an unknown flag into one
// naming the closest flag fs has (any other error is returned as is).
func FlagError(fs *flag.FlagSet, err error) error { return flagError(fs, err) }

// commands are the program's subcommands, each with its usage line in the
// main help.
var commands = []struct{ name, synopsis, about string }{
	{"consume", "consume --topic TOPIC [-o beginning|end|N|-N] [-p N] [-c N] [-e] [-f FMT]", "print a topic's committed records, like kcat -C"},
	{"produce", "produce --topic TOPIC [-p N] [-H KEY=VALUE] [--key-json FIELD | --json] < FILE", "put a record per line of the input on a topic, like kcat -P"},
	{"config", "config [flags]", "print the configuration the flags make, as YAML for --config"},
	{"replay", "replay RECORDING... [--db OUT] [--diff DB]", "apply recorded feeds again, and compare with a database"},
	{"test", "test FILE.test.yaml... [--run NAME]", "run a processor over given input, offline, and compare with expected outputs and state"},
	{"status", "status [--json]", "a running server's verdict, feeds, relay and losses"},
	{"dead-letters", "dead-letters list|show|requeue|discard FEED ...", "read and resolve a running server's dead letters"},
	{"losses", "losses list|ack FEED [--reason WHY]", "a feed's losses; acknowledge them"},
	{"topics", "topics [list | describe TOPIC]", "the Kafka topics, end offsets and the lag of the groups reading them"},
	{"bench", "bench [--lines N] [--json]", "measure this machine: ingest, relay, latency"},
	{"version", "version", "the build: module version, revision, Go"},
}

// commandHelp is what each subcommand's -h says it does, and its
// examples (after the program's name).
var commandHelp = map[string]struct {
	about    string
	examples []string
}{
	"consume": {"Prints the committed records of a topic (read with read_committed), one a line: " +
		"partition, offset, key, value and headers, tab-separated (headers as KEY=VALUE separated by spaces, " +
		"quoted when they hold spaces), or one JSON object each with --format json, or as -f says. " +
		"It follows the topic until interrupted, or stops after -c records, or with -e (--until-end) at the end " +
		"the topic had when it started; then it prints the count on stderr.",
		[]string{"consume --topic ledger.out -o beginning -e",
			"consume --topic ledger.out -p 0 -o -10 -c 10",
			`consume --topic ledger.dlq -o beginning -e -f '%p:%o %k %h\n'`,
			"consume --brokers kafka-1:9092 --topic ledger.out -o 1200 --format json"}},
	"produce": {"Puts a record per line of its input on a topic (the dev broker creates the topic on first use), " +
		"and prints the count on stderr.",
		[]string{"produce --topic ledger.in < ledger.csv",
			"produce --topic orders.events --key-json order.id -H source=import < orders.jsonl",
			`produce --topic orders.events -p 2 --json <<< '{"key":"o-1","value":{"type":"placed"}}'`}},
	"config": {"Prints the configuration the server would run with (flags, OUTBOXD_* variables, the --config file " +
		"and defaults merged) as YAML that --config reads back, each value's comment saying where it came from. " +
		"It takes the server's flags, grouped as in " + "the main help.",
		[]string{"config --feed ledger=file:./ledger.csv --processor ledger=ledger > outboxd.yaml",
			"config --config outboxd.yaml"}},
	"replay": {"Applies recorded feeds (--record) again, in a database of their own, and says whether the outputs " +
		"and state are those of the recorded run; --diff DB compares them with another database, --diff alone with " +
		"what the recorded processor makes of the same recordings (--config new.yaml: a new version of a SQL processor).",
		[]string{"replay /var/lib/outboxd/rec --db /tmp/replay.db --diff /var/lib/outboxd/outboxd.db",
			"replay /var/lib/outboxd/rec/ledger --config new.yaml --diff",
			"replay /var/lib/outboxd/rec/ledger --processor ledger --json"}},
	"test": {"Runs a processor (a SQL processor of a configuration file, or a built-in or registered one) over " +
		"each test's input lines, items or recording, on a temporary database, and compares the outputs, dead letters " +
		"and state rows with the expected ones, printing what differs (see docs/processors.md).",
		[]string{"test examples/ledger.test.yaml", "test examples/*.test.yaml --run malformed"}},
	"status": {"Prints a running server's verdict (what is wrong first, with what to do), every feed, the relay, " +
		"the backlog and the losses, from its API (what the dashboard shows).",
		[]string{"status", "status --url http://10.0.0.5:8080 --token-file /etc/outboxd/read.token --json"}},
	"dead-letters": {"Lists, shows, requeues and discards a running server's dead letters, through its API " +
		"(a read token lists and shows; an admin token requeues and discards).",
		[]string{"dead-letters list ledger --open", "dead-letters show ledger 12",
			"dead-letters requeue ledger 12 --payload 'bob,7' --note 'fixed by hand'",
			"dead-letters discard ledger --reason malformed --note 'test lines'"}},
	"losses": {"Lists a feed's losses (input that vanished unread), or acknowledges them, recorded with the " +
		"token's name and the reason, through a running server's API.",
		[]string{"losses list ledger", "losses ack ledger --reason 'rotated before it was read; restored from backup'"}},
	"topics": {"Lists the Kafka topics the server's brokers hold, or describes one with its partitions' end offsets " +
		"and the lag of the groups reading it, through a running server's API.",
		[]string{"topics", "topics describe ledger.out --group billing"}},
}

// helpOf prints the -h of the command name (its commandHelp).
func helpOf(w io.Writer, name, synopsis string, fs *flag.FlagSet) {
	h := commandHelp[name]
	CommandHelp(w, synopsis, h.about, fs, h.examples...)
}

// unknownCommand is the error of a first argument that is no subcommand
// (nor a flag), naming the closest one.
func unknownCommand(name string) error {
	known := map[string]bool{}
	for _, c := range commands {
		known[c.name] = true
	}
	return fmt.Errorf("unknown command %q (the closest is %s)", name, closest(name, known))
}

// flagGroup is a section of the main help: the flags of one concern, and
// an example.
type flagGroup struct {
	title   string
	flags   []string
	example string
}

// flagGroups are the main help's sections, in order; every flag of
// flagSet is in one (TestUsage_EveryFlagOnce).
var flagGroups = []flagGroup{
	{"Feeds: what to read, and what each item becomes",
		[]string{"feed", "processor", "topic", "key-field", "group", "on-failure", "on-processor-change", "max-line",
			"retry-delay", "retry-attempts", "file-assume-no-unseen-writes"},
		"--feed ledger=file:./ledger.csv --processor ledger=ledger --topic ledger=balances"},
	{"Store: the SQLite database, one transaction per batch",
		[]string{"db", "synchronous", "batch-max", "batch-bytes", "batch-wait", "on-completion-failure", "outbox-retention",
			"new-database", "record", "record-max-bytes", "record-snapshot",
			"record-max-age", "record-max-total-bytes", "record-snapshot-interval"},
		"--db /var/lib/outboxd/outboxd.db --batch-max 1000 --batch-wait 50ms"},
	{"Relay: publishing the outbox to Kafka",
		[]string{"brokers", "relay", "relay-batch", "relay-wait", "relay-timestamp", "relay-request-timeout",
			"relay-delivery-timeout", "max-message-bytes", "transactional-id", "progress-topic",
			"create-topics", "topic-partitions", "topic-replication", "dev-broker-addr", "dev-broker-data"},
		"--brokers kafka-1:9092,kafka-2:9092 --create-topics --topic-replication 3"},
	{"Sinks: relaying the outbox also to NATS JetStream, a PostgreSQL table or webhooks (docs/sinks.md)",
		[]string{"sink"},
		"--sink events=nats://127.0.0.1:4222 --sink audit=postgres://outboxd@db/audit"},
	{"Kafka security: TLS and SASL to the brokers (the relay, Kafka feeds, consume and produce)",
		[]string{"kafka-tls", "kafka-tls-ca", "kafka-tls-cert", "kafka-tls-key", "kafka-tls-server-name",
			"kafka-tls-insecure-skip-verify", "kafka-sasl-mechanism", "kafka-sasl-user", "kafka-sasl-password-file"},
		"--kafka-tls --kafka-sasl-mechanism SCRAM-SHA-512 --kafka-sasl-user outboxd --kafka-sasl-password-file /etc/outboxd/kafka.pass"},
	{"HTTP: the API, dashboard, metrics and state queries",
		[]string{"http", "http-tls-cert", "http-tls-key", "admin-token-file", "api-token", "query-timeout", "query-max-rows",
			"query-max-bytes"},
		"--http 0.0.0.0:8080 --api-token ops=@/etc/outboxd/ops.token,grafana:read=@/etc/outboxd/read.token"},
	{"Limits: the backlog while Kafka is away, and the shutdown",
		[]string{"max-backlog-bytes", "max-backlog-rows", "shutdown-grace"},
		"--max-backlog-bytes 10GiB --shutdown-grace 30s"},
	{"Cluster: many servers sharing a Kafka feed on one PostgreSQL database (docs/cluster.md)",
		[]string{"kafka-group", "server-id", "relay-lease"},
		"--db postgres://outboxd@db/outboxd --feed orders=kafka:orders --kafka-group orders=outboxd-orders"},
	{"General",
		[]string{"config", "log-level", "log-format"},
		"--config /etc/outboxd/outboxd.yaml --log-format json"},
}

// usage prints the main help: the commands, then every flag by concern,
// each group with an example.
func usage(w io.Writer) {
	fmt.Fprintf(w, `outboxd: applies at-least-once feeds to state in SQLite exactly once, and
publishes their outputs to Kafka exactly once.

Usage:
`)
	commandLine(w, "[flags]", "run the service (flags below)")
	for _, c := range commands {
		commandLine(w, c.synopsis, c.about)
	}
	fmt.Fprintf(w, `
Each command's flags: %[1]s COMMAND -h. Every flag below can also be set as
OUTBOXD_<NAME> (e.g. OUTBOXD_BATCH_MAX=500; repeatable flags take
comma-separated values) or in the YAML file of --config.

Start:
  %[1]s --feed ledger=file:./ledger.csv --processor ledger=ledger
`, programName)
	printFlagGroups(w)
}

// printFlagGroups prints the service's flags by concern (flagGroups).
func printFlagGroups(w io.Writer) {
	c := DefaultConfig()
	var p string
	fs := flagSet(&c, &p, &givenSettings{})
	for _, g := range flagGroups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		PrintFlags(w, fs, g.flags...)
		fmt.Fprintf(w, "  Example: %s %s\n", programName, g.example)
	}
}

// apiFlagSet holds the flags every API command takes, for the help of a
// command whose subcommand is not given.
func apiFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("api", flag.ContinueOnError)
	var af apiFlags
	af.register(fs, true)
	return fs
}

// closestOf is " (the closest is X)" for the name of names closest to
// name, "" when none is within half of name's length.
func closestOf(name string, names ...string) string {
	known := map[string]bool{}
	for _, n := range names {
		known[n] = true
	}
	best := closest(name, known)
	if best == "" || editDistance(name, best) > max(len(name)/2, 2) {
		return ""
	}
	return " (the closest is " + best + ")"
}

// commandLine prints a command's synopsis and, on the next line, what it
// does, as PrintFlags prints a flag.
func commandLine(w io.Writer, synopsis, about string) {
	fmt.Fprintf(w, "  %s %s\n%s", programName, synopsis, wrap(about, "      ", helpWidth))
}

// groupedFlags are the names of the flags in flagGroups, sorted.
func groupedFlags() []string {
	var names []string
	for _, g := range flagGroups {
		names = append(names, g.flags...)
	}
	sort.Strings(names)
	return names
}
