package server

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/outboxd/outboxd/api"
)

// statusCommand prints what the dashboard shows: the verdict, every feed,
// the relay and the backlog, the losses (GET /status).
func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	var af apiFlags
	af.register(fs, true)
	if _, code, done := parseAPICommand(fs, args, "status [--json] [--url URL] [--token TOKEN]", nil, 0, stdout, stderr); done {
		return code
	}
	c, err := af.client(os.Getenv)
	if err != nil {
		return apiUsage(stderr, "status", err)
	}
	ctx, stop := withTimeout(ctx, af.timeout)
	defer stop()
	var ov api.Overview
	b, err := c.getJSON(ctx, "/status", &ov)
	if err != nil {
		return apiFailed(stderr, "status", err)
	}
	if af.json {
		stdout.Write(b)
		return ExitOK
	}
	printOverview(stdout, c.base, ov)
	return ExitOK
}

// printOverview writes ov for people: the verdict first, with what to do,
// then a line per feed, the relay and the losses.
func printOverview(w io.Writer, base string, ov api.Overview) {
	v := ov.Verdict
	fmt.Fprintf(w, "%s: %s\n", strings.ToUpper(v.Level), v.Message)
	fmt.Fprintf(w, "  what to do: %s\n", v.Action)
	for _, c := range v.Conditions[min(1, len(v.Conditions)):] {
		fmt.Fprintf(w, "  also %s: %s\n", strings.ToUpper(c.Level), c.Message)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FEED\tSTATE\tPOSITION/END\tLAG\tAPPLIED\tDEAD LETTERS\tLOSSLESS\tOUTBOX")
	for _, fs := range ov.Feeds {
		lossless := "yes"
		if !fs.Lossless {
			lossless = fmt.Sprintf("NO (%d losses)", fs.LossCount)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d %s\t%d\t%d\t%s\t%d pending\n", fs.Feed, fs.State, fs.Position, fs.End, fs.Lag,
			unitWord(fs.Kind), fs.Applied, fs.DeadLettered, lossless, fs.Outbox.Pending)
	}
	tw.Flush()
	if len(ov.Feeds) == 0 {
		fmt.Fprintln(w, "  (no feeds: start the server with --feed NAME=file:PATH)")
	}
	for _, fs := range ov.Feeds {
		if fs.LastError != "" {
			fmt.Fprintf(w, "  %s: %s\n", fs.Feed, fs.LastError)
		}
	}
	fmt.Fprintln(w)
	o, r := ov.Outbox, ov.Outbox.Relay
	state := r.State
	if r.Mode != api.RelayModeNone {
		state = fmt.Sprintf("%s, %s", r.Mode, r.State)
		if r.Connected {
			state += " (connected)"
		} else {
			state += " (not connected)"
		}
	}
	fmt.Fprintf(w, "relay: %s; backlog %d rows, %s, oldest %.1f s; last published id %d of %d\n", state, o.Pending,
		humanBytes(o.PendingBytes), o.OldestPendingAge, o.LastPublishedID, o.LastOutboxID)
	if r.LastError != "" {
		fmt.Fprintf(w, "  relay error: %s\n", r.LastError)
	}
	for _, fs := range ov.Feeds {
		for _, l := range fs.Losses {
			if l.AckedAt != nil {
				continue
			}
			extent := fmt.Sprintf("from %d, extent unknown", l.From)
			if l.To != nil {
				extent = fmt.Sprintf("%d to %d", l.From, *l.To)
			}
			fmt.Fprintf(w, "loss of %s at %s: %s (partition %d, %s)\n", fs.Feed, l.At.Format("2006-01-02 15:04:05Z07:00"), l.Reason, l.Partition, extent)
		}
	}
	for _, d := range ov.RecentDeadLetters {
		fmt.Fprintf(w, "dead letters of %s in the last hour, not resolved: %d (%s dead-letters list %s --open)\n", d.Feed, d.Count, cliName(), d.Feed)
	}
	fmt.Fprintf(w, "(%s at %s)\n", base, ov.At.Format("2006-01-02 15:04:05Z07:00"))
}

// unitWord is the unit of a feed kind's positions.
func unitWord(kind string) string {
	if kind == "kafka" {
		return "records"
	}
	return "bytes"
}

// humanBytes writes n as 512 B or 3.2 MiB.
func humanBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, i := float64(n), 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
