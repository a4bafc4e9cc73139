package outbox

import (
	"math"
	"strconv"
	"strings"
)

// Headers every published record carries, set by the relay from its row's
// columns, after the row's own headers.
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

// HeaderPrefix starts the name of every header outboxd sets. A published
// record carries each such name once.
const HeaderPrefix = "outboxd-"

// HeaderOrigPrefix starts the names under which a record re-emitted through
// the outbox (a dead letter of an item read from Kafka) keeps the place
// headers of the record it came from: outboxd-id becomes outboxd-orig-id.
const HeaderOrigPrefix = "outboxd-orig-"

// PlaceHeader reports whether key is one of the headers the relay sets
// from a row's columns.
func PlaceHeader(key string) bool {
	switch key {
	case HeaderID, HeaderFeed, HeaderEpoch, HeaderPosition:
		return true
	}
	return false
}

// OrigHeader is the name under which a re-emitted record keeps the place
// header key of the record it came from: outboxd-orig-id for outboxd-id.
func OrigHeader(key string) string {
	return HeaderOrigPrefix + strings.TrimPrefix(key, HeaderPrefix)
}

// MinMessageBytes is the smallest record limit outboxd takes (the relay's
// and the ingest loop's MaxMessageBytes): room for a dead letter's headers
// beside a cut payload.
const MinMessageBytes = 4 << 10

// Sizes of Kafka records (format v2), as the relay's producer counts them.
const (
	// RecordBatchOverhead is what a record batch adds around its records
	// (its v2 header). A broker measures a batch against its limit
	// (message.max.bytes), so a record alone in its batch has the limit
	// less this.
	RecordBatchOverhead = 61
	// recordOverhead is the most a record's own framing takes (length,
	// attributes, timestamp and offset deltas, key and value lengths,
	// header count): five varints of 32 bits, one of 64, one byte.
	recordOverhead = 5*5 + 10 + 1
	// headerOverhead is the most a header's two lengths take.
	headerOverhead = 2 * 5
)

// RecordBytes is the size a producer counts for a record with key, value
// and headers: its bytes and the most its framing takes. It is what
// sarama's ProducerMessage.ByteSize says for record format v2, and never
// less than the record's encoding.
func RecordBytes(key, value []byte, headers []Header) int {
	n := recordOverhead + len(key) + len(value)
	for _, h := range headers {
		n += len(h.Key) + len(h.Value) + headerOverhead
	}
	return n
}

// maxIDDigits is the longest an outbox id is in decimal.
var maxIDDigits = len(strconv.FormatInt(math.MaxInt64, 10))

// PublishedBytes bounds what RecordBytes counts for the record the relay
// publishes for output o of an item at place p, whatever id its row gets:
// o's headers (a place header renamed as OrigHeader says), then the four
// place headers, the id at its longest.
func PublishedBytes(p Place, o Output) int {
	n := RecordBytes(o.Key, o.Value, o.Headers)
	for _, h := range o.Headers {
		if PlaceHeader(h.Key) {
			n += len(HeaderOrigPrefix) - len(HeaderPrefix)
		}
	}
	n += len(HeaderID) + maxIDDigits + headerOverhead
	n += len(HeaderFeed) + len(p.Feed) + headerOverhead
	n += len(HeaderEpoch) + len(p.Epoch) + headerOverhead
	n += len(HeaderPosition) + len(strconv.FormatInt(p.Position, 10)) + headerOverhead
	return n
}
