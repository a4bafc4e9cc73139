package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/devkafka"
)

// toolBrokers is the default --brokers of consume and produce: the dev
// broker's default address.
var toolBrokers = []string{devkafka.DefaultAddr}

// toolConnectTimeout is the default --connect-timeout of consume and
// produce.
const toolConnectTimeout = 5 * time.Second

// toolMaxLine is the default --max-line of produce: Kafka's default
// largest message.
const toolMaxLine = 1 << 20

// consumeCommand prints a topic's committed records: until ctx is done (a
// signal), -c records, or with --until-end until it has read what the
// topic held at the call.
func consumeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := consumeOptions{Brokers: toolBrokers, Offset: "end", Partition: -1}
	fs.Var(list{&o.Brokers}, "brokers", "Kafka brokers, a comma-separated `LIST` of HOST:PORT")
	fs.StringVar(&o.Topic, "topic", "", "the `TOPIC` to read (required)")
	alias(fs, "t", "topic")
	fs.StringVar(&o.Offset, "offset", o.Offset, "where each partition is read from (`OFFSET`): beginning, end (only new records), "+
		"N (offset N) or -N (the last N offsets before the end; transaction markers take offsets too)")
	alias(fs, "o", "offset")
	fromBeginning := fs.Bool("from-beginning", false, "read from the start of each partition (-o beginning)")
	fs.IntVar(&o.Partition, "partition", o.Partition, "read only partition `N` (default: every partition)")
	alias(fs, "p", "partition")
	fs.Int64Var(&o.Count, "count", 0, "stop after `N` records (0: no limit), and print the count on stderr")
	alias(fs, "c", "count")
	fs.BoolVar(&o.UntilEnd, "until-end", false, "stop once caught up with the topic's end at the moment of the call, and print the count on stderr")
	alias(fs, "e", "until-end")
	fs.StringVar(&o.Format, "format", consumeText, "output `FORMAT`: text (partition, offset, key, value, headers; tab-separated) "+
		"or json (one object per record, with its timestamp)")
	fs.StringVar(&o.FormatString, "format-string", "", "print each record as `FMT`, like kcat -f: %t topic, %p partition, %o offset, "+
		"%k key, %s value, %h headers (KEY=VALUE separated by spaces, quoted when they hold spaces), %T timestamp in ms, "+
		"%K and %S key and value lengths, \\n \\t escapes")
	alias(fs, "f", "format-string")
	timeout := fs.Duration("timeout", 0, "stop after this long (`D`; 0: no limit)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", toolConnectTimeout, "fail when no broker answers within this long (`D`)")
	var tk toolKafka
	tk.register(fs, &o.Brokers)
	if code, done := parseTool(fs, &tk, args, "consume", "consume --topic TOPIC [-o beginning|end|N|-N] [-p N] [-c N] [-e] [--format text|json | -f FMT] [--brokers LIST] [--kafka-* ...]", stdout, stderr); done {
		return code
	}
	if *fromBeginning && !given(fs, "offset", "o") {
		o.Offset = "beginning"
	}
	switch _, err := parseOffset(o.Offset); {
	case o.Topic == "":
		return commandUsage(stderr, "consume", errors.New("--topic is required"))
	case err != nil:
		return commandUsage(stderr, "consume", err)
	case *fromBeginning && o.Offset != "beginning":
		return commandUsage(stderr, "consume", fmt.Errorf("--from-beginning and -o %s: give one", o.Offset))
	case o.Format != consumeText && o.Format != consumeJSON:
		return commandUsage(stderr, "consume", fmt.Errorf("--format %q: want text or json", o.Format))
	case o.FormatString != "" && given(fs, "format"):
		return commandUsage(stderr, "consume", errors.New("--format and -f: give one"))
	case o.Count < 0:
		return commandUsage(stderr, "consume", fmt.Errorf("-c %d: want 0 (no limit) or more", o.Count))
	case o.Partition < -1:
		return commandUsage(stderr, "consume", fmt.Errorf("-p %d: want a partition, 0 or more", o.Partition))
	}
	if err := checkFormatString(o.FormatString); err != nil {
		return commandUsage(stderr, "consume", err)
	}
	ctx, stop := withTimeout(ctx, *timeout)
	defer stop()
	sec, err := tk.settings(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s consume: %v\n", programName, err)
		return 1
	}
	o.Kafka = sec
	n, err := consumeTopic(ctx, o, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "%s consume: %v\n", programName, err)
		return 1
	}
	if o.UntilEnd || o.Count > 0 {
		fmt.Fprintf(stderr, "%d records\n", n)
	}
	return 0
}

// headerList is a repeatable -H KEY=VALUE.
type headerList struct{ p *[]header }

func (h headerList) String() string { return "" }

func (h headerList) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want KEY=VALUE", s)
	}
	*h.p = append(*h.p, header{Key: k, Value: []byte(v)})
	return nil
}

// produceCommand puts a record per line of stdin on a topic, until ctx is
// done (a signal) or the input ends.
func produceCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := produceOptions{Brokers: toolBrokers, Partition: unset}
	fs.Var(list{&o.Brokers}, "brokers", "Kafka brokers, a comma-separated `LIST` of HOST:PORT")
	fs.StringVar(&o.Topic, "topic", "", "the `TOPIC` to write (required; the dev broker creates it)")
	alias(fs, "t", "topic")
	fs.IntVar(&o.Partition, "partition", o.Partition, "put every record on partition `N` (default: by the key's hash)")
	alias(fs, "p", "partition")
	fs.Var(headerList{&o.Headers}, "header", "add the header `KEY=VALUE` to every record (repeatable)")
	alias(fs, "H", "header")
	fs.IntVar(&o.KeyField, "key-field", 0, "key each record by the line's `N`-th comma-separated field (1-based; 0: no key)")
	fs.StringVar(&o.KeyJSON, "key-json", "", "each line is a JSON object: key its record by the object's `FIELD` "+
		"(a dotted path such as order.id; a string as is, another value as its JSON), the line being the value")
	fs.BoolVar(&o.JSON, "json", false, `each line is {"key": "...", "value": <string or JSON>, "headers": {"k": "v"}, "partition": N} (each but value optional)`)
	fs.IntVar(&o.MaxLine, "max-line", toolMaxLine, "longest line in bytes (`N`)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", toolConnectTimeout, "fail when no broker answers within this long (`D`)")
	var tk toolKafka
	tk.register(fs, &o.Brokers)
	if code, done := parseTool(fs, &tk, args, "produce", "produce --topic TOPIC [-p N] [-H KEY=VALUE]... [--key-field N | --key-json FIELD | --json] [--brokers LIST] [--kafka-* ...] < FILE", stdout, stderr); done {
		return code
	}
	keys := 0
	for _, set := range []bool{o.KeyField != 0, o.KeyJSON != "", o.JSON} {
		if set {
			keys++
		}
	}
	switch {
	case o.Topic == "":
		return commandUsage(stderr, "produce", errors.New("--topic is required"))
	case o.KeyField < 0:
		return commandUsage(stderr, "produce", errors.New("--key-field is a 1-based field number"))
	case keys > 1:
		return commandUsage(stderr, "produce", errors.New("--key-field, --key-json and --json: give one"))
	case o.Partition < unset:
		return commandUsage(stderr, "produce", fmt.Errorf("-p %d: want a partition, 0 or more", o.Partition))
	case o.MaxLine < 1:
		return commandUsage(stderr, "produce", fmt.Errorf("--max-line %d: want at least 1", o.MaxLine))
	}
	sec, err := tk.settings(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s produce: %v\n", programName, err)
		return 1
	}
	o.Kafka = sec
	n, err := produceLines(ctx, o, stdin)
	fmt.Fprintf(stderr, "%d records produced to %s\n", n, o.Topic)
	if err != nil {
		fmt.Fprintf(stderr, "%s produce: %v\n", programName, err)
		return 1
	}
	return 0
}

// alias adds to fs the short name of the flag long, for the same value;
// the help shows them together ("-o, --offset OFFSET").
func alias(fs *flag.FlagSet, short, long string) {
	f := fs.Lookup(long)
	fs.Var(f.Value, short, aliasMark+long)
}

// aliasMark starts the usage of an alias, followed by its flag's name.
const aliasMark = "\x00alias of "

// given says whether any of the flags names was set.
func given(fs *flag.FlagSet, names ...string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || slices.Contains(names, f.Name) })
	return set
}

// parseTool parses a tool subcommand's flags. done says the command must
// return code now: after -h (0) or a bad flag (2).
func parseTool(fs *flag.FlagSet, tk *toolKafka, args []string, name, synopsis string, stdout, stderr io.Writer) (code int, done bool) {
	err := tk.parse(fs, args, os.Getenv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		helpOf(stdout, name, synopsis, fs)
		return 0, true
	case err != nil:
		return commandUsage(stderr, name, flagError(fs, err)), true
	case fs.NArg() > 0:
		return commandUsage(stderr, name, fmt.Errorf("unexpected argument %q", fs.Arg(0))), true
	}
	if err := tk.resolve(os.Getenv); err != nil {
		return commandUsage(stderr, name, err), true
	}
	return 0, false
}

// withTimeout is ctx, ending after timeout too when it is above 0.
func withTimeout(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, timeout)
}
