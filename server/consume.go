package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/outboxd/outboxd/internal/devkafka"
)

// consumeCommand prints a topic's committed records until ctx is done (a
// signal).
func consumeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var brokers []string
	fs.Var(list{&brokers}, "brokers", "Kafka brokers, comma-separated")
	topic := fs.String("topic", "", "the topic to read")
	fromBeginning := fs.Bool("from-beginning", false, "read from the start of each partition (default: only new records)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "Usage: server consume --brokers B --topic T [--from-beginning]")
			fs.PrintDefaults()
			return 0
		}
		return badUsage(stderr, fmt.Errorf("consume: %w", err))
	}
	if len(brokers) == 0 || *topic == "" {
		return badUsage(stderr, errors.New("consume: --brokers and --topic are required"))
	}
	if err := devkafka.Consume(ctx, brokers, *topic, *fromBeginning, stdout); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "consume: %v\n", err)
		return 1
	}
	return 0
}
