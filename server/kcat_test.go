package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kcatCluster is a kfake cluster with the topic t of three partitions.
func kcatCluster(t *testing.T) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()[0]
}

// tool runs the consume or produce command with stdin and returns its exit
// code, stdout and stderr.
func tool(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var code int
	switch args[0] {
	case "consume":
		code = consumeCommand(ctx, args[1:], &out, &errb)
	case "produce":
		code = produceCommand(ctx, args[1:], strings.NewReader(stdin), &out, &errb)
	}
	return code, out.String(), errb.String()
}

// TestProduceConsume_LikeKcat puts records on chosen partitions with
// headers and keys from a JSON field, then reads them back by partition,
// offset (from the start, absolute, from the end) and count, as text,
// JSON (with timestamps) and a format string, against kfake.
func TestProduceConsume_LikeKcat(t *testing.T) {
	broker := kcatCluster(t)
	produce := func(stdin string, args ...string) {
		t.Helper()
		code, _, errOut := tool(t, stdin, append([]string{"produce", "--brokers", broker, "-t", "t"}, args...)...)
		if code != 0 {
			t.Fatalf("produce %v: exit %d: %s", args, code, errOut)
		}
	}
	// Partition 1: four orders keyed by their id, with two headers, one
	// of them with a space.
	produce(`{"order":{"id":"o-1"},"n":1}
{"order":{"id":"o-2"},"n":2}
{"order":{"id":7},"n":3}
{"order":{"id":"o-4"},"n":4}
`, "-p", "1", "--key-json", "order.id", "-H", "source=import job", "-H", "run=3")
	// Partition 2, named by the line itself.
	produce(`{"key":"k","value":"v w","partition":2,"headers":{"h":"x=y"}}`+"\n", "--json")

	consume := func(args ...string) (string, string) {
		t.Helper()
		code, out, errOut := tool(t, "", append([]string{"consume", "--brokers", broker, "-t", "t"}, args...)...)
		if code != 0 {
			t.Fatalf("consume %v: exit %d: %s", args, code, errOut)
		}
		return out, errOut
	}
	out, errOut := consume("-o", "beginning", "-e", "-p", "1")
	want := "1\t0\to-1\t{\"order\":{\"id\":\"o-1\"},\"n\":1}\tsource=\"import job\" run=3\n" +
		"1\t1\to-2\t{\"order\":{\"id\":\"o-2\"},\"n\":2}\tsource=\"import job\" run=3\n" +
		"1\t2\t7\t{\"order\":{\"id\":7},\"n\":3}\tsource=\"import job\" run=3\n" +
		"1\t3\to-4\t{\"order\":{\"id\":\"o-4\"},\"n\":4}\tsource=\"import job\" run=3\n"
	if out != want || errOut != "4 records\n" {
		t.Fatalf("partition 1 from the beginning:\n%s%s\nwant\n%s4 records", out, errOut, want)
	}
	if out, _ := consume("-p", "1", "-o", "-2", "-e", "-f", `%o:%k\n`); out != "2:7\n3:o-4\n" {
		t.Fatalf("the last two of partition 1: %q", out)
	}
	if out, _ := consume("-p", "1", "-o", "1", "-c", "2", "-f", `%o\t%k %K %S|%h\n`); out != "1\to-2 3 28|source=\"import job\" run=3\n2\t7 1 24|source=\"import job\" run=3\n" {
		t.Fatalf("two of partition 1 from offset 1: %q", out)
	}
	if out, errOut := consume("-o", "end", "-e"); out != "" || errOut != "0 records\n" {
		t.Fatalf("-o end -e: %q %q", out, errOut)
	}
	// Every partition, as JSON: the timestamp of each, and headers that
	// read back exactly.
	out, _ = consume("-o", "beginning", "-e", "--format", "json")
	var recs []consumedRecord
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var r consumedRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		ts, err := time.Parse(time.RFC3339Nano, r.Timestamp)
		if err != nil || time.Since(ts) > time.Minute || time.Since(ts) < -time.Minute {
			t.Fatalf("record %s: timestamp %q (%v)", l, r.Timestamp, err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 5 {
		t.Fatalf("%d records, want 5:\n%s", len(recs), out)
	}
	last := recs[len(recs)-1]
	if recs[0].Partition == 2 {
		last = recs[0]
	}
	if last.Partition != 2 || last.Offset != 0 || *last.Key != "k" || *last.Value != "v w" ||
		len(last.Headers) != 1 || last.Headers[0] != (consumedHeader{"h", "x=y"}) {
		t.Fatalf("partition 2's record %+v", last)
	}
	if out, _ := consume("-p", "2", "-o", "beginning", "-e"); out != "2\t0\tk\tv w\th=\"x=y\"\n" {
		t.Fatalf("partition 2 as text: %q", out)
	}
}

// TestProduceConsume_Mistakes: a bad -o, -p, -f, or a line without the key
// field is a one-line error.
func TestProduceConsume_Mistakes(t *testing.T) {
	broker := kcatCluster(t)
	for _, tc := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"", []string{"consume", "-t", "t", "-o", "middle"}, 2,
			`server consume: -o "middle": want beginning, end, an offset N or -N (the last N) (see server consume -h)`},
		{"", []string{"consume", "-t", "t", "-f", "%x"}, 2,
			`server consume: -f "%x": unknown %x (want %t %p %o %k %s %h %T %K %S or %%) (see server consume -h)`},
		{"", []string{"consume", "-t", "t", "--format", "json", "-f", "%k"}, 2, "server consume: --format and -f: give one (see server consume -h)"},
		{"", []string{"consume", "--brokers", broker, "-t", "t", "-p", "3", "-e"}, 1, "server consume: consume t: no partition 3 (the topic has 3)"},
		{"", []string{"produce", "-t", "t", "--key-json", "id", "--json"}, 2,
			"server produce: --key-field, --key-json and --json: give one (see server produce -h)"},
		{"", []string{"produce", "-t", "t", "-H", "novalue"}, 2,
			`server produce: invalid value "novalue" for flag -H: "novalue": want KEY=VALUE (see server produce -h)`},
		{`{"id":"a"}` + "\n" + `{"other":1}` + "\n", []string{"produce", "--brokers", broker, "-t", "t", "--key-json", "id"}, 1,
			"1 records produced to t\nserver produce: produce t: line 2: --key-json id: the line has no id"},
	} {
		code, out, errOut := tool(t, tc.stdin, tc.args...)
		if code != tc.code || out != "" || errOut != tc.want+"\n" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
	// The record before the bad line was produced, keyed by its field.
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fs := cl.PollFetches(ctx)
	if recs := fs.Records(); len(recs) != 1 || string(recs[0].Key) != "a" || string(recs[0].Value) != `{"id":"a"}` {
		t.Fatalf("records %v (%v)", recs, fs.Err())
	}
}
