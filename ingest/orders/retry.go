package orders

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// maxRetryShift caps the doubling of the retry delay, so it cannot overflow.
const maxRetryShift = 20

// origin returns where the delivered record was first read, and which
// attempt this is. A record of the feed's main topic is its own origin,
// attempt 1; a record of an extra topic (the retry topic) carries both in
// its headers, and without them it is malformed.
func (p *Processor) origin(d ingest.Delivery, item ingest.Item) (Place, int, error) {
	if d.Topic != p.cfg.RetryTopic {
		return Place{Topic: p.cfg.SourceTopic, Partition: d.Partition, Epoch: d.Epoch, Offset: d.Position - 1}, 1, nil
	}
	return retryOrigin(item.Headers)
}

// retryOrigin reads a retry record's original place and attempt.
func retryOrigin(hs []outbox.Header) (Place, int, error) {
	topic, _ := ingest.HeaderValue(hs, ingest.HeaderOrigTopic)
	epoch, _ := ingest.HeaderValue(hs, ingest.HeaderOrigEpoch)
	if len(topic) == 0 || len(epoch) == 0 {
		return Place{}, 0, fmt.Errorf("a retry record without headers %s and %s", ingest.HeaderOrigTopic, ingest.HeaderOrigEpoch)
	}
	part, err := headerInt(hs, ingest.HeaderOrigPartition, 0, math.MaxInt32)
	if err != nil {
		return Place{}, 0, err
	}
	offset, err := headerInt(hs, ingest.HeaderOrigOffset, 0, math.MaxInt64-1)
	if err != nil {
		return Place{}, 0, err
	}
	attempt, err := headerInt(hs, ingest.HeaderRetryAttempt, 2, math.MaxInt32)
	if err != nil {
		return Place{}, 0, err
	}
	return Place{Topic: string(topic), Partition: int32(part), Epoch: string(epoch), Offset: offset}, int(attempt), nil
}

// headerInt reads a decimal header within lo..hi.
func headerInt(hs []outbox.Header, key string, lo, hi int64) (int64, error) {
	v, ok := ingest.HeaderValue(hs, key)
	if !ok {
		return 0, fmt.Errorf("a retry record without header %s", key)
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("a retry record with header %s = %q, want a number in %d..%d", key, v, lo, hi)
	}
	return n, nil
}

// retryDelay is how long attempt waits after the one before it: RetryDelay
// before attempt 2, doubling for each attempt after.
func (p *Processor) retryDelay(attempt int) time.Duration {
	return p.cfg.RetryDelay << min(attempt-2, maxRetryShift)
}

// retry sends the record to the retry topic, to come back as attempt
// after its delay, keyed and valued as it came, with its original place.
func (p *Processor) retry(ctx context.Context, tx *outbox.Tx, item ingest.Item, from Place, attempt int) error {
	due := p.cfg.Now().Add(p.retryDelay(attempt))
	hs := make([]outbox.Header, 0, len(item.Headers)+6)
	for _, h := range item.Headers {
		if !strings.HasPrefix(h.Key, "outboxd-") {
			hs = append(hs, h)
		}
	}
	hs = append(hs,
		outbox.Header{Key: ingest.HeaderOrigTopic, Value: []byte(from.Topic)},
		outbox.Header{Key: ingest.HeaderOrigPartition, Value: strconv.AppendInt(nil, int64(from.Partition), 10)},
		outbox.Header{Key: ingest.HeaderOrigOffset, Value: strconv.AppendInt(nil, from.Offset, 10)},
		outbox.Header{Key: ingest.HeaderOrigEpoch, Value: []byte(from.Epoch)},
		outbox.Header{Key: ingest.HeaderRetryAttempt, Value: strconv.AppendInt(nil, int64(attempt), 10)},
		outbox.Header{Key: ingest.HeaderRetryDue, Value: strconv.AppendInt(nil, due.UnixMilli(), 10)},
	)
	return tx.Emit(ctx, outbox.Output{Topic: p.cfg.RetryTopic, Key: item.Key, Value: item.Value, Headers: hs})
}
