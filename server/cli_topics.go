package server

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/outboxd/outboxd/api"
)

const topicsSynopsis = `topics [list]
       topics describe TOPIC [--group G]...
  (each with [--url URL] [--json])`

// groupList is a repeatable --group.
type groupList []string

func (g *groupList) String() string     { return strings.Join(*g, ",") }
func (g *groupList) Set(v string) error { *g = append(*g, v); return nil }

// topicsCommand lists the cluster's topics, or describes one with its
// offsets and the lag of the groups reading it, as the server sees them.
func topicsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sub := "list"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	if sub != "list" && sub != "describe" {
		return apiUsage(stderr, "topics", fmt.Errorf("%q: want list or describe%s", sub, closestOf(sub, "list", "describe")))
	}
	fs := flag.NewFlagSet("topics "+sub, flag.ContinueOnError)
	var af apiFlags
	af.register(fs, true)
	var groups groupList
	want := []string(nil)
	if sub == "describe" {
		fs.Var(&groups, "group", "also show this consumer `GROUP`'s committed offsets and lag (repeatable)")
		want = []string{"TOPIC"}
	}
	pos, code, done := parseAPICommand(fs, args, topicsSynopsis, want, 0, stdout, stderr)
	if done {
		return code
	}
	c, err := af.client(os.Getenv)
	if err != nil {
		return apiUsage(stderr, fs.Name(), err)
	}
	ctx, stop := withTimeout(ctx, af.timeout)
	defer stop()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if sub == "list" {
		var list api.TopicList
		b, err := c.getJSON(ctx, "/topics", &list)
		if err != nil {
			return apiFailed(stderr, fs.Name(), err)
		}
		if af.json {
			stdout.Write(b)
			return ExitOK
		}
		fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tOUTBOXD")
		for _, t := range list.Topics {
			roles := strings.Join(t.Roles, ", ")
			if t.Internal {
				roles = strings.TrimPrefix(roles+", internal", ", ")
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\n", t.Topic, t.Partitions, roles)
		}
		tw.Flush()
		return ExitOK
	}
	q := url.Values{"group": groups}
	var d api.KafkaTopicDetail
	b, err := c.getJSON(ctx, "/topics/"+url.PathEscape(pos[0])+"?"+q.Encode(), &d)
	if err != nil {
		return apiFailed(stderr, fs.Name(), err)
	}
	if af.json {
		stdout.Write(b)
		return ExitOK
	}
	fmt.Fprintf(stdout, "topic %s", d.Topic)
	if len(d.Roles) > 0 {
		fmt.Fprintf(stdout, " (%s)", strings.Join(d.Roles, ", "))
	}
	fmt.Fprintln(stdout)
	head := "PARTITION\tLEADER\tSTART\tEND"
	for _, g := range d.Groups {
		head += "\t" + g + " COMMITTED\tLAG"
	}
	var feeds []string
	if len(d.Partitions) > 0 {
		for _, p := range d.Partitions[0].Positions {
			feeds = append(feeds, p.Feed)
			head += "\t" + p.Feed + " POSITION\tLAG"
		}
	}
	fmt.Fprintln(tw, head)
	for _, p := range d.Partitions {
		line := fmt.Sprintf("%d\t%d\t%d\t%d", p.Partition, p.Leader, p.Start, p.End)
		for _, g := range p.Groups {
			committed := "-"
			if g.Committed != nil {
				committed = fmt.Sprint(*g.Committed)
			}
			line += fmt.Sprintf("\t%s\t%d", committed, g.Lag)
		}
		for _, f := range feeds {
			cell := "\t-\t-"
			for _, pos := range p.Positions {
				if pos.Feed == f {
					cell = fmt.Sprintf("\t%d\t%d", pos.Position, pos.Lag)
				}
			}
			line += cell
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	return ExitOK
}
