package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/outboxd/outboxd/internal/devkafka"
)

// toolBrokers is the default --brokers of consume and produce: the dev
// broker's default address.
var toolBrokers = []string{devkafka.DefaultAddr}

// consumeCommand prints a topic's committed records: until ctx is done (a
// signal), or with --until-end until it has read what the topic held at the
// call.
func consumeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := devkafka.ConsumeOptions{Brokers: toolBrokers}
	fs.Var(list{&o.Brokers}, "brokers", "Kafka brokers, a comma-separated `LIST` of HOST:PORT")
	fs.StringVar(&o.Topic, "topic", "", "the `TOPIC` to read (required)")
	fs.BoolVar(&o.FromBeginning, "from-beginning", false, "read from the start of each partition (default: only new records)")
	fs.BoolVar(&o.UntilEnd, "until-end", false, "stop once caught up with the topic's end at the moment of the call, and print the count on stderr")
	fs.StringVar(&o.Format, "format", devkafka.FormatText, "output `FORMAT`: text (partition, offset, key, value, headers; tab-separated) or json (one object per record)")
	timeout := fs.Duration("timeout", 0, "stop after this long (`D`; 0: no limit)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", devkafka.DefaultConnectTimeout, "fail when no broker answers within this long (`D`)")
	var tk toolKafka
	tk.register(fs, &o.Brokers)
	if code, done := parseTool(fs, &tk, args, "consume", "consume --topic TOPIC [--brokers LIST] [--from-beginning] [--until-end] [--format text|json] [--timeout D] [--kafka-* ...]", stdout, stderr); done {
		return code
	}
	if o.Topic == "" {
		return commandUsage(stderr, "consume", errors.New("--topic is required"))
	}
	if o.Format != devkafka.FormatText && o.Format != devkafka.FormatJSON {
		return commandUsage(stderr, "consume", fmt.Errorf("--format %q: want text or json", o.Format))
	}
	ctx, stop := withTimeout(ctx, *timeout)
	defer stop()
	opts, err := tk.clientOpts(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s consume: %v\n", programName, err)
		return 1
	}
	o.ClientOpts = opts
	n, err := devkafka.Consume(ctx, o, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "%s consume: %v\n", programName, err)
		return 1
	}
	if o.UntilEnd {
		fmt.Fprintf(stderr, "%d records\n", n)
	}
	return 0
}

// produceCommand puts a record per line of stdin on a topic, until ctx is
// done (a signal) or the input ends.
func produceCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := devkafka.ProduceOptions{Brokers: toolBrokers}
	fs.Var(list{&o.Brokers}, "brokers", "Kafka brokers, a comma-separated `LIST` of HOST:PORT")
	fs.StringVar(&o.Topic, "topic", "", "the `TOPIC` to write (required; the dev broker creates it)")
	fs.IntVar(&o.KeyField, "key-field", 0, "key each record by the line's `N`-th comma-separated field (1-based; 0: no key)")
	fs.BoolVar(&o.JSON, "json", false, `each line is {"key": "...", "value": <string or JSON>, "headers": {"k": "v"}}`)
	fs.IntVar(&o.MaxLine, "max-line", devkafka.DefaultMaxLine, "longest line in bytes (`N`)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", devkafka.DefaultConnectTimeout, "fail when no broker answers within this long (`D`)")
	var tk toolKafka
	tk.register(fs, &o.Brokers)
	if code, done := parseTool(fs, &tk, args, "produce", "produce --topic TOPIC [--brokers LIST] [--key-field N | --json] [--kafka-* ...] < FILE", stdout, stderr); done {
		return code
	}
	if o.Topic == "" {
		return commandUsage(stderr, "produce", errors.New("--topic is required"))
	}
	if o.KeyField < 0 || (o.JSON && o.KeyField > 0) {
		return commandUsage(stderr, "produce", errors.New("--key-field is a 1-based field number, and not given with --json"))
	}
	opts, err := tk.clientOpts(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s produce: %v\n", programName, err)
		return 1
	}
	o.ClientOpts = opts
	n, err := devkafka.Produce(ctx, o, stdin)
	fmt.Fprintf(stderr, "%d records produced to %s\n", n, o.Topic)
	if err != nil {
		fmt.Fprintf(stderr, "%s produce: %v\n", programName, err)
		return 1
	}
	return 0
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
