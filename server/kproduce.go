package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
)

// produceOptions say where the produce command puts its records and how
// it reads them.
type produceOptions struct {
	Brokers []string
	Topic   string
	// KeyField, when above 0, keys each record by the line's KeyField-th
	// comma-separated field (1-based); 0: no key.
	KeyField int
	// KeyJSON keys each record by a field of the line read as a JSON
	// object (a dotted path: "order.id"); the line is the value, as is.
	KeyJSON string
	// JSON reads each line as an object {"key": ..., "value": ...,
	// "headers": {...}, "partition": N}: key a string (or absent), value a
	// string (sent as is) or any other JSON value (sent as its compact
	// JSON), headers an object of strings, partition optional.
	JSON bool
	// Partition, 0 or more, puts every record on that partition; -1: the
	// key's partition (by hash), or any for no key.
	Partition int
	// Headers are added to every record, after a --json line's own.
	Headers []header
	// MaxLine bounds a line in bytes.
	MaxLine int
	// ConnectTimeout bounds the wait for the brokers' first answer.
	ConnectTimeout time.Duration
	// Kafka is how to connect (TLS, SASL).
	Kafka kafkasec.Settings
}

// produceLines reads r line by line ("\n"-terminated, a trailing "\r"
// dropped; empty lines skipped) and produces a record per line to
// o.Topic with an idempotent producer, waiting for every
// acknowledgement. It returns the number of records acknowledged. A line
// it cannot read (over MaxLine, not a JSON object with --json, without
// the key field) stops it with an error naming the line; the records
// before it stay produced.
func produceLines(ctx context.Context, o produceOptions, r io.Reader) (int64, error) {
	if err := ping(ctx, o); err != nil {
		return 0, err
	}
	sc := kafka.Config("outboxd-produce", o.Kafka)
	sc.Metadata.AllowAutoTopicCreation = true // the dev broker creates the topic
	sc.Producer.Idempotent = true
	sc.Net.MaxOpenRequests = 1
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.MaxMessageBytes = min(o.MaxLine+(64<<10), 1<<30)
	// A record's own partition: from -p or the line's "partition"; the
	// others go by their key's hash, as the Java client hashes.
	sc.Producer.Partitioner = func(topic string) sarama.Partitioner {
		return toolPartitioner{byKey: sarama.NewMurmur2Partitioner(topic)}
	}
	ap, err := sarama.NewAsyncProducer(o.Brokers, sc)
	if err != nil {
		return 0, fmt.Errorf("produce %s: %w", o.Topic, err)
	}
	p := &producer{o: o, ap: ap}
	var collectors sync.WaitGroup
	collectors.Go(func() {
		for range ap.Successes() {
			p.acked.Add(1)
		}
	})
	collectors.Go(func() {
		for pe := range ap.Errors() {
			p.failed(pe.Err)
		}
	})
	rerr := p.readLines(ctx, r)
	ap.AsyncClose() // sends what is buffered, then closes both channels
	collectors.Wait()
	if err := p.firstErr(); err != nil {
		return p.acked.Load(), fmt.Errorf("produce %s: %w", o.Topic, err)
	}
	return p.acked.Load(), rerr
}

// ping asks the brokers for the topic's metadata within the connect
// timeout: no broker answering is one clear error.
func ping(ctx context.Context, o produceOptions) error {
	cl, err := kafka.New(o.Brokers, "outboxd-produce", o.Kafka)
	if err != nil {
		return fmt.Errorf("produce %s: %w", o.Topic, err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	if _, err := cl.Metadata(pctx, []string{o.Topic}, false); err != nil {
		return fmt.Errorf("produce %s: no broker of %s answered within %v: %w",
			o.Topic, strings.Join(o.Brokers, ","), o.ConnectTimeout, err)
	}
	return nil
}

// toolPartitioner puts a record on the partition it names (its
// Metadata, an int32), else on its key's.
type toolPartitioner struct{ byKey sarama.Partitioner }

// Partition is the record's own partition, or its key's; a partition past
// the topic's fails the record.
func (t toolPartitioner) Partition(m *sarama.ProducerMessage, n int32) (int32, error) {
	if want, ok := m.Metadata.(int32); ok && want != unset {
		if want >= n {
			return 0, fmt.Errorf("partition %d: the topic has %d: %w", want, n, sarama.ErrInvalidPartition)
		}
		return want, nil
	}
	return t.byKey.Partition(m, n)
}

// RequiresConsistency says a key always goes to the same partition.
func (t toolPartitioner) RequiresConsistency() bool { return true }

// unset marks a record that goes by its key's partition.
const unset = -1

func (p *producer) readLines(ctx context.Context, r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), p.o.MaxLine+2)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSuffix(sc.Bytes(), []byte("\r"))
		if len(line) == 0 {
			continue
		}
		rec, err := p.record(line)
		if err != nil {
			return fmt.Errorf("produce %s: line %d: %w", p.o.Topic, n, err)
		}
		rec.Headers = append(rec.Headers, p.o.Headers...)
		if err := p.firstErr(); err != nil {
			return fmt.Errorf("produce %s: %w", p.o.Topic, err)
		}
		select {
		case p.ap.Input() <- message(p.o.Topic, rec):
		case <-ctx.Done():
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("produce %s: a line is over %d bytes", p.o.Topic, p.o.MaxLine)
		}
		return fmt.Errorf("produce %s: read: %w", p.o.Topic, err)
	}
	return nil
}

// jsonLine is a line of --json input.
type jsonLine struct {
	Key       *string           `json:"key"`
	Value     json.RawMessage   `json:"value"`
	Headers   map[string]string `json:"headers"`
	Partition *int32            `json:"partition"`
}

// record makes the record of one line; the line's bytes are copied.
func (p *producer) record(line []byte) (*record, error) {
	rec := &record{Partition: int32(p.o.Partition)}
	switch {
	case p.o.KeyJSON != "":
		k, err := jsonField(line, p.o.KeyJSON)
		if err != nil {
			return nil, err
		}
		rec.Key, rec.Value = k, bytes.Clone(line)
		return rec, nil
	case !p.o.JSON:
		rec.Value = bytes.Clone(line)
		if p.o.KeyField > 0 {
			k, err := csvField(line, p.o.KeyField)
			if err != nil {
				return nil, err
			}
			rec.Key = []byte(k)
		}
		return rec, nil
	}
	var jl jsonLine
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jl); err != nil {
		return nil, fmt.Errorf("not a JSON object {\"key\", \"value\", \"headers\", \"partition\"}: %w", err)
	}
	if jl.Key != nil {
		rec.Key = []byte(*jl.Key)
	}
	if jl.Partition != nil {
		if *jl.Partition < 0 {
			return nil, fmt.Errorf("partition %d: want 0 or more", *jl.Partition)
		}
		rec.Partition = *jl.Partition
	}
	var s string
	switch {
	case len(jl.Value) == 0 || string(jl.Value) == "null":
		// a null value: a tombstone
	case json.Unmarshal(jl.Value, &s) == nil:
		rec.Value = []byte(s)
	default:
		var buf bytes.Buffer
		if err := json.Compact(&buf, jl.Value); err != nil {
			return nil, fmt.Errorf("value: %w", err)
		}
		rec.Value = buf.Bytes()
	}
	for _, k := range slices.Sorted(maps.Keys(jl.Headers)) {
		rec.Headers = append(rec.Headers, header{Key: k, Value: []byte(jl.Headers[k])})
	}
	return rec, nil
}

// jsonField is the field at path (dotted) of the JSON object line: a
// string as is, any other value as its compact JSON. A missing field or
// a null is an error: a record keyed by a field needs the key.
func jsonField(line []byte, path string) ([]byte, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("--key-json %s: not JSON: %w", path, err)
	}
	for _, name := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("--key-json %s: %q is not in an object", path, name)
		}
		if v, ok = obj[name]; !ok || v == nil {
			return nil, fmt.Errorf("--key-json %s: the line has no %s", path, path)
		}
	}
	if s, ok := v.(string); ok {
		return []byte(s), nil
	}
	return json.Marshal(v)
}

// csvField returns the n-th (1-based) field of a CSV line.
func csvField(line []byte, n int) (string, error) {
	r := csv.NewReader(bytes.NewReader(line))
	r.LazyQuotes = true // a JSON value after the key field is fine
	fields, err := r.Read()
	if err != nil {
		return "", fmt.Errorf("not a CSV line: %w", err)
	}
	if n > len(fields) {
		return "", fmt.Errorf("no field %d for the key: the line has %d", n, len(fields))
	}
	return fields[n-1], nil
}

// message is rec as sarama produces it; a nil key or value stays nil.
func message(topic string, rec *record) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: topic, Metadata: rec.Partition}
	if rec.Key != nil {
		m.Key = sarama.ByteEncoder(rec.Key)
	}
	if rec.Value != nil {
		m.Value = sarama.ByteEncoder(rec.Value)
	}
	for _, h := range rec.Headers {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return m
}

// producer is one produceLines call's progress.
type producer struct {
	o     produceOptions
	ap    sarama.AsyncProducer
	acked atomic.Int64
	mu    sync.Mutex
	err   error // the first failed produce
}

// failed keeps the first failure.
func (p *producer) failed(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
}

func (p *producer) firstErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
