package devkafka

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ConsumedRecord is one line Consume writes, as JSON.
type ConsumedRecord struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Key and Value are the record's bytes as a string (invalid UTF-8
	// shows as U+FFFD); nil when the record has none.
	Key     *string          `json:"key"`
	Value   *string          `json:"value"`
	Headers []ConsumedHeader `json:"headers"`
}

// ConsumedHeader is one record header, in the record's order.
type ConsumedHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Consume reads topic with read_committed isolation, from its start when
// fromBeginning is true or else from its end, and writes each record to w
// as one JSON line (ConsumedRecord) as it arrives. It runs until ctx is
// done, then returns nil; it returns early on a write error or a
// non-retriable Kafka error. A topic that does not exist yet is waited for.
func Consume(ctx context.Context, brokers []string, topic string, fromBeginning bool, w io.Writer) error {
	start := kgo.NewOffset().AtEnd()
	if fromBeginning {
		start = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(start),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		return fmt.Errorf("consume %s: %w", topic, err)
	}
	defer cl.Close()
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fetchError(fs); err != nil {
			return fmt.Errorf("consume %s: %w", topic, err)
		}
		var werr error
		fs.EachRecord(func(r *kgo.Record) {
			if werr == nil {
				werr = enc.Encode(consumed(r))
			}
		})
		if werr == nil {
			werr = bw.Flush()
		}
		if werr != nil {
			return fmt.Errorf("consume %s: write: %w", topic, werr)
		}
	}
}

// fetchError returns the first error worth stopping for: not a retriable
// one, which the client retries by itself, nor a topic still missing.
func fetchError(fs kgo.Fetches) error {
	for _, fe := range fs.Errors() {
		switch {
		case errors.Is(fe.Err, context.Canceled), errors.Is(fe.Err, context.DeadlineExceeded),
			errors.Is(fe.Err, kerr.UnknownTopicOrPartition), errors.Is(fe.Err, kerr.UnknownTopicID),
			kerr.IsRetriable(fe.Err):
			continue
		}
		return fe.Err
	}
	return nil
}

func consumed(r *kgo.Record) ConsumedRecord {
	c := ConsumedRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Key: bytesPtr(r.Key), Value: bytesPtr(r.Value), Headers: make([]ConsumedHeader, 0, len(r.Headers))}
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, ConsumedHeader{Key: h.Key, Value: string(h.Value)})
	}
	return c
}

func bytesPtr(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}
