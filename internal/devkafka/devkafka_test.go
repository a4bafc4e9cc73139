package devkafka_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/devkafka"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, o devkafka.Options) *devkafka.Broker {
	t.Helper()
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	o.Logger = quiet()
	b, err := devkafka.StartWith(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func produce(t *testing.T, addr, topic string, o devkafka.ProduceOptions, input string) int64 {
	t.Helper()
	o.Brokers, o.Topic = []string{addr}, topic
	n, err := devkafka.Produce(context.Background(), o, strings.NewReader(input))
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	return n
}

func consumeJSON(t *testing.T, addr, topic string) []devkafka.ConsumedRecord {
	t.Helper()
	var out bytes.Buffer
	n, err := devkafka.Consume(context.Background(), devkafka.ConsumeOptions{
		Brokers: []string{addr}, Topic: topic, FromBeginning: true, UntilEnd: true, Format: devkafka.FormatJSON,
	}, &out)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	var recs []devkafka.ConsumedRecord
	dec := json.NewDecoder(&out)
	for dec.More() {
		var r devkafka.ConsumedRecord
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

// TestProduceConsume puts records on a topic the broker creates itself and
// reads them back to the end, keyed by a CSV field and from JSON lines.
func TestProduceConsume(t *testing.T) {
	b := start(t, devkafka.Options{AutoCreateTopics: true, Partitions: 1})
	if n := produce(t, b.Addr(), "csv", devkafka.ProduceOptions{KeyField: 2}, "a,k1,{\"x\":1}\n\nb,k2\r\n"); n != 2 {
		t.Fatalf("produced %d, want 2 (the empty line is skipped)", n)
	}
	got := consumeJSON(t, b.Addr(), "csv")
	if len(got) != 2 || str(got[0].Key) != "k1" || str(got[0].Value) != `a,k1,{"x":1}` ||
		str(got[1].Key) != "k2" || str(got[1].Value) != "b,k2" || got[1].Offset != 1 {
		t.Fatalf("csv records: %+v", got)
	}
	in := `{"key":"o-1","value":{"type":"placed", "at":"2026-12-01T00:00:00Z"},"headers":{"b":"2","a":"1"}}
{"value":"plain"}
{"key":"o-2","value":null}
`
	if n := produce(t, b.Addr(), "json", devkafka.ProduceOptions{JSON: true}, in); n != 3 {
		t.Fatalf("produced %d JSON records, want 3", n)
	}
	got = consumeJSON(t, b.Addr(), "json")
	if len(got) != 3 || str(got[0].Key) != "o-1" || str(got[0].Value) != `{"type":"placed","at":"2026-12-01T00:00:00Z"}` ||
		len(got[0].Headers) != 2 || got[0].Headers[0] != (devkafka.ConsumedHeader{Key: "a", Value: "1"}) ||
		got[1].Key != nil || str(got[1].Value) != "plain" || got[2].Value != nil {
		t.Fatalf("json records: %+v", got)
	}
	t.Run("BadLine", func(t *testing.T) {
		n, err := devkafka.Produce(context.Background(), devkafka.ProduceOptions{
			Brokers: []string{b.Addr()}, Topic: "json", JSON: true,
		}, strings.NewReader("{\"value\":\"ok\"}\nnot json\n{\"value\":\"never\"}\n"))
		if err == nil || !strings.Contains(err.Error(), "line 2") || n != 1 {
			t.Fatalf("bad line: %d produced, err %v; want 1 and an error naming line 2", n, err)
		}
	})
	t.Run("Text", func(t *testing.T) {
		var out bytes.Buffer
		n, err := devkafka.Consume(context.Background(), devkafka.ConsumeOptions{
			Brokers: []string{b.Addr()}, Topic: "csv", FromBeginning: true, UntilEnd: true,
		}, &out)
		want := "0\t0\tk1\ta,k1,{\"x\":1}\n0\t1\tk2\tb,k2\n"
		if err != nil || n != 2 || out.String() != want {
			t.Fatalf("text: %d, %v:\n%q\nwant\n%q", n, err, out.String(), want)
		}
	})
}

// TestConsume_UntilEndTransactions reads a topic whose log ends in a
// transaction marker, as the relay's topics do, and an aborted transaction:
// --until-end stops at the end and counts only committed records.
func TestConsume_UntilEndTransactions(t *testing.T) {
	b := start(t, devkafka.Options{AutoCreateTopics: true, Partitions: 2})
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.TransactionalID("t1"), kgo.DefaultProduceTopic("txn"),
		kgo.AllowAutoTopicCreation())
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
	done := make(chan []devkafka.ConsumedRecord, 1)
	go func() { done <- consumeJSON(t, b.Addr(), "txn") }()
	select {
	case got := <-done:
		if len(got) != 3 || str(got[0].Value) != "a" || str(got[2].Value) != "c" {
			t.Fatalf("committed records: %+v", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consume --until-end did not stop at the end of a log ending in a marker")
	}
	var out bytes.Buffer
	n, err := devkafka.Consume(ctx, devkafka.ConsumeOptions{Brokers: []string{b.Addr()}, Topic: "txn", UntilEnd: true}, &out)
	if err != nil || n != 0 || out.Len() != 0 {
		t.Fatalf("until-end without from-beginning: %d records, %v", n, err)
	}
}

// TestConsume_Errors: a missing topic and a broker that does not answer
// are errors within the connect timeout, not a silent wait.
func TestConsume_Errors(t *testing.T) {
	b := start(t, devkafka.Options{})
	for name, o := range map[string]devkafka.ConsumeOptions{
		"MissingTopic": {Brokers: []string{b.Addr()}, Topic: "nope"},
		"NoBroker":     {Brokers: []string{"127.0.0.1:1"}, Topic: "x"},
	} {
		t.Run(name, func(t *testing.T) {
			o.ConnectTimeout = 2 * time.Second
			start := time.Now()
			_, err := devkafka.Consume(context.Background(), o, io.Discard)
			if err == nil || time.Since(start) > 20*time.Second {
				t.Fatalf("err %v after %v", err, time.Since(start))
			}
			if name == "MissingTopic" && !errors.Is(err, devkafka.ErrTopicNotFound) {
				t.Fatalf("err %v, want ErrTopicNotFound", err)
			}
		})
	}
}

// TestBroker_DataDir: records produced before a restart are consumed
// after it, from a broker started on the same directory.
func TestBroker_DataDir(t *testing.T) {
	dir := t.TempDir()
	b1, err := devkafka.StartWith(devkafka.Options{Addr: "127.0.0.1:0", DataDir: dir, AutoCreateTopics: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	addr := b1.Addr()
	if n := produce(t, addr, "kept", devkafka.ProduceOptions{}, "one\ntwo\n"); n != 2 {
		t.Fatalf("produced %d", n)
	}
	b1.Close()
	b2 := start(t, devkafka.Options{Addr: addr, DataDir: dir})
	if b2.DataDir() != dir {
		t.Fatalf("data dir %q", b2.DataDir())
	}
	got := consumeJSON(t, b2.Addr(), "kept")
	if len(got) != 2 || str(got[0].Value)+str(got[1].Value) != "onetwo" && str(got[0].Value)+str(got[1].Value) != "twoone" {
		t.Fatalf("after restart: %+v", got)
	}
}
