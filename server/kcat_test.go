package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/devkafka"
	"github.com/outboxd/outboxd/internal/testutil"
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

// TestProduceConsume_DevBroker produces to the dev broker (which creates
// the topic) and reads every record back once, to the end and then
// following the topic until stopped.
func TestProduceConsume_DevBroker(t *testing.T) {
	b, err := devkafka.StartWith(devkafka.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), AutoCreateTopics: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 40
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, `{"key":"k%d","value":"v%d","headers":{"id":"%d"}}`+"\n", i%4, i, i)
	}
	if code, _, errOut := tool(t, in.String(), "produce", "--brokers", b.Addr(), "-t", "dev", "--json"); code != 0 ||
		errOut != fmt.Sprintf("%d records produced to dev\n", n) {
		t.Fatalf("produce: exit %d: %q", code, errOut)
	}
	check := func(out string) {
		t.Helper()
		seen := map[string]bool{}
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			var r consumedRecord
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			if len(r.Headers) != 1 || r.Headers[0].Key != "id" || r.Key == nil || r.Value == nil {
				t.Fatalf("record %s", l)
			}
			id := r.Headers[0].Value
			if seen[id] || r.Topic != "dev" || *r.Value != "v"+id || *r.Key != "k"+strconv.Itoa(atoi(t, id)%4) {
				t.Fatalf("unexpected record %s", l)
			}
			seen[id] = true
		}
		if len(seen) != n {
			t.Fatalf("%d records, want %d:\n%s", len(seen), n, out)
		}
	}
	code, out, errOut := tool(t, "", "consume", "--brokers", b.Addr(), "-t", "dev", "-o", "beginning", "-e", "--format", "json")
	if code != 0 || errOut != fmt.Sprintf("%d records\n", n) {
		t.Fatalf("consume -e: exit %d: %s", code, errOut)
	}
	check(out)

	// Following: it prints what is there and runs until stopped.
	buf := &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- consumeCommand(ctx, []string{"--brokers", b.Addr(), "-t", "dev", "-o", "beginning", "--format", "json"}, buf, io.Discard)
	}()
	testutil.Wait(t, 10*time.Second, func() error {
		if got := bytes.Count(buf.Bytes(), []byte("\n")); got < n {
			return fmt.Errorf("%d lines", got)
		}
		return nil
	})
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("consume, stopped: exit %d", code)
	}
	check(buf.String())
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// devBroker is a dev broker that creates topics of parts partitions.
func devBroker(t *testing.T, parts int) *devkafka.Broker {
	t.Helper()
	b, err := devkafka.StartWith(devkafka.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		AutoCreateTopics: true, Partitions: parts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// consumeAllJSON reads topic from the start to its end as JSON records.
func consumeAllJSON(t *testing.T, addr, topic string) []consumedRecord {
	t.Helper()
	var out bytes.Buffer
	n, err := consumeTopic(context.Background(), consumeOptions{Brokers: []string{addr}, Topic: topic, Offset: "beginning",
		Partition: -1, UntilEnd: true, Format: consumeJSON, ConnectTimeout: toolConnectTimeout}, &out)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	var recs []consumedRecord
	dec := json.NewDecoder(&out)
	for dec.More() {
		var r consumedRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if int64(len(recs)) != n {
		t.Fatalf("consume counted %d, wrote %d", n, len(recs))
	}
	return recs
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestProduceConsume_CSVAndJSON puts records on a topic the dev broker
// creates and reads them back to the end, keyed by a CSV field and from
// JSON lines (a JSON value compacted, headers sorted, a null value a
// tombstone); a bad line stops produce after the lines before it.
func TestProduceConsume_CSVAndJSON(t *testing.T) {
	b := devBroker(t, 1)
	produce := func(topic string, o produceOptions, input string) (int64, error) {
		o.Brokers, o.Topic, o.Partition, o.MaxLine, o.ConnectTimeout = []string{b.Addr()}, topic, unset, toolMaxLine, toolConnectTimeout
		return produceLines(context.Background(), o, strings.NewReader(input))
	}
	if n, err := produce("csv", produceOptions{KeyField: 2}, "a,k1,{\"x\":1}\n\nb,k2\r\n"); n != 2 || err != nil {
		t.Fatalf("produced %d, %v; want 2 (the empty line is skipped)", n, err)
	}
	got := consumeAllJSON(t, b.Addr(), "csv")
	if len(got) != 2 || str(got[0].Key) != "k1" || str(got[0].Value) != `a,k1,{"x":1}` ||
		str(got[1].Key) != "k2" || str(got[1].Value) != "b,k2" || got[1].Offset != 1 {
		t.Fatalf("csv records: %+v", got)
	}
	in := `{"key":"o-1","value":{"type":"placed", "at":"2026-12-01T00:00:00Z"},"headers":{"b":"2","a":"1"}}
{"value":"plain"}
{"key":"o-2","value":null}
`
	if n, err := produce("json", produceOptions{JSON: true}, in); n != 3 || err != nil {
		t.Fatalf("produced %d JSON records, %v; want 3", n, err)
	}
	got = consumeAllJSON(t, b.Addr(), "json")
	if len(got) != 3 || str(got[0].Key) != "o-1" || str(got[0].Value) != `{"type":"placed","at":"2026-12-01T00:00:00Z"}` ||
		len(got[0].Headers) != 2 || got[0].Headers[0] != (consumedHeader{Key: "a", Value: "1"}) ||
		got[1].Key != nil || str(got[1].Value) != "plain" || got[2].Value != nil {
		t.Fatalf("json records: %+v", got)
	}
	n, err := produce("json", produceOptions{JSON: true}, "{\"value\":\"ok\"}\nnot json\n{\"value\":\"never\"}\n")
	if err == nil || !strings.Contains(err.Error(), "line 2") || n != 1 {
		t.Fatalf("bad line: %d produced, err %v; want 1 and an error naming line 2", n, err)
	}
	var out bytes.Buffer
	n, err = consumeTopic(context.Background(), consumeOptions{Brokers: []string{b.Addr()}, Topic: "csv", Offset: "beginning",
		Partition: -1, UntilEnd: true, ConnectTimeout: toolConnectTimeout}, &out)
	want := "0\t0\tk1\ta,k1,{\"x\":1}\n0\t1\tk2\tb,k2\n"
	if err != nil || n != 2 || out.String() != want {
		t.Fatalf("text: %d, %v:\n%q\nwant\n%q", n, err, out.String(), want)
	}
}

// TestConsume_UntilEndTransactions reads a topic whose log ends in a
// transaction marker, as the relay's topics do, and an aborted transaction:
// --until-end stops at the end and counts only committed records.
func TestConsume_UntilEndTransactions(t *testing.T) {
	b := devBroker(t, 2)
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.TransactionalID("t1"), kgo.DefaultProduceTopic("txn"),
		kgo.AllowAutoTopicCreation(), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	txn := func(commit bool, values ...string) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v), Partition: 0}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	txn(true, "a", "b")
	txn(false, "aborted")
	txn(true, "c")
	got := consumeAllJSON(t, b.Addr(), "txn")
	if len(got) != 3 || str(got[0].Value) != "a" || str(got[1].Value) != "b" || str(got[2].Value) != "c" || got[2].Offset != 5 {
		t.Fatalf("committed records: %+v", got)
	}
	var out bytes.Buffer
	n, err := consumeTopic(ctx, consumeOptions{Brokers: []string{b.Addr()}, Topic: "txn", Offset: "end", Partition: -1,
		UntilEnd: true, ConnectTimeout: toolConnectTimeout}, &out)
	if err != nil || n != 0 || out.Len() != 0 {
		t.Fatalf("until-end from the end: %d records, %v", n, err)
	}
}

// TestConsume_Errors: a missing topic and a broker that does not answer
// are errors within the connect timeout, not a silent wait.
func TestConsume_Errors(t *testing.T) {
	b := devBroker(t, 1)
	for name, o := range map[string]consumeOptions{
		"MissingTopic": {Brokers: []string{b.Addr()}, Topic: "nope"},
		"NoBroker":     {Brokers: []string{"127.0.0.1:1"}, Topic: "x"},
	} {
		t.Run(name, func(t *testing.T) {
			o.ConnectTimeout, o.Offset, o.Partition = 2*time.Second, "end", -1
			start := time.Now()
			_, err := consumeTopic(context.Background(), o, io.Discard)
			if err == nil || time.Since(start) > 20*time.Second {
				t.Fatalf("err %v after %v", err, time.Since(start))
			}
			if name == "MissingTopic" && !errors.Is(err, errTopicNotFound) {
				t.Fatalf("err %v, want errTopicNotFound", err)
			}
		})
	}
}
