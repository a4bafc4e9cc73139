package ingest

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// The retry-topic contract. A processor that cannot apply an item yet (an
// event that arrived before the one it depends on) may send it to a retry
// topic through the outbox, in the item's own transaction, with RetryOutput:
// the record carries its origin (where it was first read), the attempt it
// will be, and when it is due back. A processor that does so implements
// RetryTopicUser; the server then has the processor's Kafka feed read that
// topic too, and the feed holds each of its records until due (RetryDue).
// When the record comes back, OriginOf gives the processor the origin and
// the attempt, so it keys its effects by the origin and applies them once
// however many rounds the record makes. Nothing here knows a feed's
// partition numbering: the origin of an item read first is its Delivery.

// RetryTopicUser is implemented by processors that send items to a retry
// topic: RetryTopic names it ("" for none). A Kafka feed of such a processor
// also reads that topic.
type RetryTopicUser interface {
	RetryTopic() string
}

// Origin is where a record was first read: its topic, the feed partition,
// the feed epoch and the offset (its position less one). For a Kafka feed's
// main topic the feed partition is the topic's partition.
type Origin struct {
	Topic     string
	Partition int32
	Epoch     string
	Offset    int64
}

// OriginOf returns where the delivered item was first read and which attempt
// this is. An item read from retryTopic carries both in its headers (an
// error wrapped by Permanent with ReasonMalformed when they are missing or
// bad); any other item is its own origin, attempt 1.
func OriginOf(d Delivery, item Item, retryTopic string) (Origin, int, error) {
	if retryTopic == "" || d.Topic != retryTopic {
		return Origin{Topic: d.Topic, Partition: d.Partition, Epoch: d.Epoch, Offset: d.Position - 1}, 1, nil
	}
	o, attempt, err := retryOrigin(item.Headers)
	if err != nil {
		return Origin{}, 0, Permanent(ReasonMalformed, err)
	}
	return o, attempt, nil
}

// RetryOutput is the output that sends item to topic, to come back at due
// as attempt (2 for the first retry), keyed and valued as it came, with its
// origin in headers. The item's own outboxd-* headers are dropped, so the
// record carries each of them once.
func RetryOutput(topic string, item Item, from Origin, attempt int, due time.Time) outbox.Output {
	hs := make([]outbox.Header, 0, len(item.Headers)+6)
	for _, h := range item.Headers {
		if !strings.HasPrefix(h.Key, "outboxd-") {
			hs = append(hs, h)
		}
	}
	hs = append(hs,
		outbox.Header{Key: HeaderOrigTopic, Value: []byte(from.Topic)},
		outbox.Header{Key: HeaderOrigPartition, Value: strconv.AppendInt(nil, int64(from.Partition), 10)},
		outbox.Header{Key: HeaderOrigOffset, Value: strconv.AppendInt(nil, from.Offset, 10)},
		outbox.Header{Key: HeaderOrigEpoch, Value: []byte(from.Epoch)},
		outbox.Header{Key: HeaderRetryAttempt, Value: strconv.AppendInt(nil, int64(attempt), 10)},
		outbox.Header{Key: HeaderRetryDue, Value: strconv.AppendInt(nil, due.UnixMilli(), 10)},
	)
	return outbox.Output{Topic: topic, Key: item.Key, Value: item.Value, Headers: hs}
}

// retryOrigin reads a retry record's origin and attempt.
func retryOrigin(hs []outbox.Header) (Origin, int, error) {
	topic, _ := HeaderValue(hs, HeaderOrigTopic)
	epoch, _ := HeaderValue(hs, HeaderOrigEpoch)
	if len(topic) == 0 || len(epoch) == 0 {
		return Origin{}, 0, fmt.Errorf("a retry record without headers %s and %s", HeaderOrigTopic, HeaderOrigEpoch)
	}
	part, err := headerInt(hs, HeaderOrigPartition, 0, math.MaxInt32)
	if err != nil {
		return Origin{}, 0, err
	}
	offset, err := headerInt(hs, HeaderOrigOffset, 0, math.MaxInt64-1)
	if err != nil {
		return Origin{}, 0, err
	}
	attempt, err := headerInt(hs, HeaderRetryAttempt, 2, math.MaxInt32)
	if err != nil {
		return Origin{}, 0, err
	}
	return Origin{Topic: string(topic), Partition: int32(part), Epoch: string(epoch), Offset: offset}, int(attempt), nil
}

// headerInt reads a decimal header within lo..hi.
func headerInt(hs []outbox.Header, key string, lo, hi int64) (int64, error) {
	v, ok := HeaderValue(hs, key)
	if !ok {
		return 0, fmt.Errorf("a retry record without header %s", key)
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("a retry record with header %s = %q, want a number in %d..%d", key, v, lo, hi)
	}
	return n, nil
}

// Headers of a record sent to a retry topic, to come back to its feed later.
// Values are decimal text, except the topic and epoch.
const (
	// HeaderRetryDue is when the record is due back, in Unix milliseconds. A
	// Kafka feed holds a record of an extra topic carrying it until then.
	HeaderRetryDue = "outboxd-retry-due"
	// HeaderRetryAttempt is the attempt the retried record will be: 2 for
	// the first retry.
	HeaderRetryAttempt = "outboxd-retry-attempt"
	// HeaderOrigTopic, HeaderOrigPartition, HeaderOrigOffset and
	// HeaderOrigEpoch name the record's original place: its topic, Kafka
	// partition, offset and feed epoch.
	HeaderOrigTopic     = "outboxd-orig-topic"
	HeaderOrigPartition = "outboxd-orig-partition"
	HeaderOrigOffset    = "outboxd-orig-offset"
	HeaderOrigEpoch     = "outboxd-orig-epoch"
)

// HeaderValue returns the value of the last header named key, and whether
// there is one.
func HeaderValue(hs []outbox.Header, key string) ([]byte, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return hs[i].Value, true
		}
	}
	return nil, false
}

// RetryDue returns the time in HeaderRetryDue; ok is false when the header
// is missing or not a number.
func RetryDue(hs []outbox.Header) (due time.Time, ok bool) {
	v, ok := HeaderValue(hs, HeaderRetryDue)
	if !ok {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
