package server

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/outboxd/outboxd/api"
)

const lossesSynopsis = `losses list FEED
       losses ack FEED --reason WHY
  (each with [--url URL] [--token T] [--json])`

// lossesCommand lists a feed's losses, or acknowledges them (an admin
// token; recorded with the token's name and the reason).
func lossesCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			helpOf(stdout, "losses", lossesSynopsis, apiFlagSet())
			return ExitOK
		}
		return apiUsage(stderr, "losses", fmt.Errorf("want list or ack (see %s losses -h)", cliName()))
	}
	sub, args := args[0], args[1:]
	if sub != "list" && sub != "ack" {
		return apiUsage(stderr, "losses", fmt.Errorf("%q: want list or ack%s", sub, closestOf(sub, "list", "ack")))
	}
	fs := flag.NewFlagSet("losses "+sub, flag.ContinueOnError)
	var af apiFlags
	af.register(fs, true)
	reason := ""
	if sub == "ack" {
		fs.StringVar(&reason, "reason", "", "why (`WHY`) the losses are acknowledged (required; recorded with them)")
	}
	pos, code, done := parseAPICommand(fs, args, lossesSynopsis, []string{"FEED"}, 0, stdout, stderr)
	if done {
		return code
	}
	if sub == "ack" && reason == "" {
		return apiUsage(stderr, fs.Name(), fmt.Errorf("--reason WHY is required: an acknowledgement is recorded with why"))
	}
	c, err := af.client(os.Getenv)
	if err != nil {
		return apiUsage(stderr, fs.Name(), err)
	}
	ctx, stop := withTimeout(ctx, af.timeout)
	defer stop()
	if sub == "ack" {
		var res api.AckResult
		b, err := c.postJSON(ctx, feedPath(pos[0])+"/losses/ack", api.AckRequest{Reason: reason}, &res)
		if err != nil {
			return apiFailed(stderr, fs.Name(), err)
		}
		if af.json {
			stdout.Write(b)
			return ExitOK
		}
		fmt.Fprintf(stdout, "%d losses of %s acknowledged by %s: lossless again\n", res.Acked, res.Feed, res.By)
		return ExitOK
	}
	var st api.FeedStatus
	b, err := c.getJSON(ctx, feedPath(pos[0])+"/status", &st)
	if err != nil {
		return apiFailed(stderr, fs.Name(), err)
	}
	if af.json {
		stdout.Write(b)
		return ExitOK
	}
	state := "lossless"
	if !st.Lossless {
		state = "NOT LOSSLESS"
	}
	fmt.Fprintf(stdout, "%s: %s, %d losses\n", st.Feed, state, st.LossCount)
	for _, l := range st.Losses {
		extent := fmt.Sprintf("from %d, extent unknown", l.From)
		if l.To != nil {
			extent = fmt.Sprintf("%d to %d", l.From, *l.To)
		}
		ack := "not acknowledged"
		if l.AckedAt != nil {
			ack = fmt.Sprintf("acknowledged %s by %s: %s", l.AckedAt.Format("2006-01-02 15:04:05"), l.AckedBy, l.AckReason)
		}
		fmt.Fprintf(stdout, "  %s  %s (partition %d, %s); %s\n", l.At.Format("2006-01-02 15:04:05"), l.Reason, l.Partition, extent, ack)
	}
	return ExitOK
}
