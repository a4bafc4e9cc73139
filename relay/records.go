package relay

import (
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/outbox"
)

// Headers the relay adds to every record, after the row's own headers (so a
// consumer's "last header with this key" finds them). They come from the
// row's columns and are not stored.
const (
	// HeaderID is the outbox row id, in decimal: a consumer of an
	// at-least-once relay drops a record whose id it has seen.
	HeaderID = "outboxd-id"
	// HeaderFeed is the feed of the item that produced the row.
	HeaderFeed = "outboxd-feed"
	// HeaderEpoch is that item's epoch.
	HeaderEpoch = "outboxd-epoch"
	// HeaderPosition is that item's position, in decimal.
	HeaderPosition = "outboxd-position"
)

// Header keys shared by every record: sarama only reads them.
var (
	headerIDKey       = []byte(HeaderID)
	headerFeedKey     = []byte(HeaderFeed)
	headerEpochKey    = []byte(HeaderEpoch)
	headerPositionKey = []byte(HeaderPosition)
)

// message turns an outbox row into a record. The record's timestamp is the
// row's creation time, so a republished row carries the same one. feed and
// epoch are the row's Feed and Epoch as bytes (shared between records:
// sarama only reads header values).
func message(r *outbox.Row, feed, epoch []byte) (*sarama.ProducerMessage, error) {
	hs, err := outbox.DecodeHeaders(r.Headers)
	if err != nil {
		return nil, fmt.Errorf("outbox row %d: %w: %w", r.ID, errBadRow, err)
	}
	rhs := make([]sarama.RecordHeader, 0, len(hs)+4)
	for _, h := range hs {
		rhs = append(rhs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	rhs = append(rhs,
		sarama.RecordHeader{Key: headerIDKey, Value: strconv.AppendInt(nil, r.ID, 10)},
		sarama.RecordHeader{Key: headerFeedKey, Value: feed},
		sarama.RecordHeader{Key: headerEpochKey, Value: epoch},
		sarama.RecordHeader{Key: headerPositionKey, Value: strconv.AppendInt(nil, r.Position, 10)},
	)
	m := &sarama.ProducerMessage{Topic: r.Topic, Headers: rhs, Timestamp: time.Unix(0, r.CreatedAt)}
	// A nil key must stay a nil interface: the partitioner hashes any
	// non-nil key, even an empty one, as the Java client does.
	if r.Key != nil {
		m.Key = sarama.ByteEncoder(r.Key)
	}
	if r.Value != nil {
		m.Value = sarama.ByteEncoder(r.Value)
	}
	return m, nil
}

// messages turns a batch of rows into records, in id order.
func messages(rows []outbox.Row) ([]*sarama.ProducerMessage, error) {
	ms := make([]*sarama.ProducerMessage, 0, len(rows)+1)
	var feed, epoch []byte
	for i := range rows {
		r := &rows[i]
		// Rows of a batch mostly share a feed and an epoch.
		if string(feed) != r.Feed || feed == nil {
			feed = []byte(r.Feed)
		}
		if string(epoch) != r.Epoch || epoch == nil {
			epoch = []byte(r.Epoch)
		}
		m, err := message(r, feed, epoch)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}
