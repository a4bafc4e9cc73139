package ingest

import (
	"strconv"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

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
