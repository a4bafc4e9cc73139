package relay

import (
	"fmt"
	"strconv"
	"strings"
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
	HeaderID = outbox.HeaderID
	// HeaderFeed is the feed of the item that produced the row.
	HeaderFeed = outbox.HeaderFeed
	// HeaderEpoch is that item's epoch.
	HeaderEpoch = outbox.HeaderEpoch
	// HeaderPosition is that item's position, in decimal.
	HeaderPosition = outbox.HeaderPosition
)

// Header keys shared by every record: sarama only reads them.
var (
	headerIDKey       = []byte(HeaderID)
	headerFeedKey     = []byte(HeaderFeed)
	headerEpochKey    = []byte(HeaderEpoch)
	headerPositionKey = []byte(HeaderPosition)
)

// message turns an outbox row into a record. The record's timestamp is the
// row's creation time, so a republished row carries the same one; the
// relay stamps it with the publish time instead unless Config.Timestamp
// says created (see records). feed and
// epoch are the row's Feed and Epoch as bytes (shared between records:
// sarama only reads header values).
func message(r *outbox.Row, feed, epoch []byte) (*sarama.ProducerMessage, error) {
	return newRecordSlab(1).message(r, feed, epoch)
}

// recordSlab hands out the records of a batch, their headers, their
// decimal header values and their key and value encoders from a few
// arrays, where each record would otherwise cost five allocations. A
// record keeps its batch's arrays alive while sarama holds it. Nothing
// handed out is written again until the slab is reused (see reuse), which
// the relay does only once sarama has settled every record of its batch.
type recordSlab struct {
	ptrs   []*sarama.ProducerMessage
	msgs   []sarama.ProducerMessage
	hdrs   []sarama.RecordHeader
	encs   []sarama.ByteEncoder
	digits []byte
}

// relayHeaders is the number of headers the relay adds to each record.
const relayHeaders = 4

// maxDigits is the most bytes of two decimal int64s.
const maxDigits = 2 * 20

func newRecordSlab(n int) *recordSlab {
	return &recordSlab{
		ptrs:   make([]*sarama.ProducerMessage, 0, n),
		msgs:   make([]sarama.ProducerMessage, 0, n),
		hdrs:   make([]sarama.RecordHeader, 0, n*relayHeaders),
		encs:   make([]sarama.ByteEncoder, 0, 2*n),
		digits: make([]byte, 0, n*maxDigits),
	}
}

// reuse returns s emptied when it has room for n records, a new slab
// otherwise (s may be nil). The records s handed out must all be settled
// (committed or acked): their memory is written again. What they pointed
// at (the rows' keys and values) stays reachable until then, one batch at
// most.
func (s *recordSlab) reuse(n int) *recordSlab {
	if s == nil || cap(s.msgs) < n {
		return newRecordSlab(n)
	}
	s.ptrs, s.msgs, s.hdrs, s.encs, s.digits = s.ptrs[:0], s.msgs[:0], s.hdrs[:0], s.encs[:0], s.digits[:0]
	return s
}

// message is message made from the slab's arrays.
func (s *recordSlab) message(r *outbox.Row, feed, epoch []byte) (*sarama.ProducerMessage, error) {
	hs, err := outbox.DecodeHeaders(r.Headers)
	if err != nil {
		return nil, fmt.Errorf("outbox row %d: %w: %w", r.ID, errBadRow, err)
	}
	rhs := appendRowHeaders(s.headers(len(hs)+relayHeaders), hs)
	rhs = append(rhs,
		sarama.RecordHeader{Key: headerIDKey, Value: s.decimal(r.ID)},
		sarama.RecordHeader{Key: headerFeedKey, Value: feed},
		sarama.RecordHeader{Key: headerEpochKey, Value: epoch},
		sarama.RecordHeader{Key: headerPositionKey, Value: s.decimal(r.Position)},
	)
	s.hdrs = s.hdrs[:len(s.hdrs)+len(rhs)]
	s.msgs = append(s.msgs, sarama.ProducerMessage{Topic: r.Topic, Headers: rhs[:len(rhs):len(rhs)],
		Timestamp: time.Unix(0, r.CreatedAt)})
	m := &s.msgs[len(s.msgs)-1]
	// A nil key must stay a nil interface: the partitioner hashes any
	// non-nil key, even an empty one, as the Java client does.
	if r.Key != nil {
		m.Key = s.encoder(r.Key)
	}
	if r.Value != nil {
		m.Value = s.encoder(r.Value)
	}
	return m, nil
}

// headers returns an empty slice with room for n headers, within the slab
// when it has that room.
func (s *recordSlab) headers(n int) []sarama.RecordHeader {
	if cap(s.hdrs)-len(s.hdrs) < n {
		s.hdrs = make([]sarama.RecordHeader, 0, max(n, cap(s.hdrs)))
	}
	return s.hdrs[len(s.hdrs):len(s.hdrs)]
}

// decimal returns v in decimal, in the slab's bytes.
func (s *recordSlab) decimal(v int64) []byte {
	if cap(s.digits)-len(s.digits) < maxDigits/2 {
		s.digits = make([]byte, 0, max(maxDigits, cap(s.digits)))
	}
	start := len(s.digits)
	s.digits = strconv.AppendInt(s.digits, v, 10)
	return s.digits[start:len(s.digits):len(s.digits)]
}

// encoder returns b as an Encoder without an allocation of its own: a
// pointer to an element of the slab (sarama only reads it).
func (s *recordSlab) encoder(b []byte) sarama.Encoder {
	if len(s.encs) == cap(s.encs) {
		s.encs = make([]sarama.ByteEncoder, 0, max(1, cap(s.encs)))
	}
	s.encs = append(s.encs, b)
	return &s.encs[len(s.encs)-1]
}

// appendRowHeaders appends a row's own headers as its record carries them,
// each outboxd-* name at most once, since consumers read them by name. A
// place header of the row (one the relay sets itself, say the outboxd-id
// of a Kafka record an item came from) is kept as outbox.OrigHeader names
// it, unless the row has that name already; of any other outboxd-* name
// the last one stands (a dead letter's own come after its item's). Other
// headers are the row's business and kept as they are.
func appendRowHeaders(dst []sarama.RecordHeader, hs []outbox.Header) []sarama.RecordHeader {
	reserved := false
	for _, h := range hs {
		if strings.HasPrefix(h.Key, outbox.HeaderPrefix) {
			reserved = true
			break
		}
	}
	if !reserved {
		for _, h := range hs {
			dst = append(dst, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		return dst
	}
	names := make([]string, len(hs))
	has := make(map[string]bool, len(hs))
	for _, h := range hs {
		has[h.Key] = true
	}
	for i, h := range hs {
		names[i] = h.Key
		if outbox.PlaceHeader(h.Key) {
			names[i] = ""
			if orig := outbox.OrigHeader(h.Key); !has[orig] {
				names[i] = orig
			}
		}
	}
	last := map[string]int{}
	for i, n := range names {
		if strings.HasPrefix(n, outbox.HeaderPrefix) {
			last[n] = i
		}
	}
	for i, n := range names {
		if n == "" || (strings.HasPrefix(n, outbox.HeaderPrefix) && last[n] != i) {
			continue
		}
		dst = append(dst, sarama.RecordHeader{Key: []byte(n), Value: hs[i].Value})
	}
	return dst
}

// fits reports whether m, alone in its batch, is within maxBytes as a
// broker counts it. It is sarama's own measure, which the producer's
// MaxMessageBytes (maxBytes less the batch header) applies to each record
// and to each partition's batch (see saramaConfig), so a record that fits
// is never refused by the producer, nor by a broker whose limit is
// maxBytes.
func fits(m *sarama.ProducerMessage, maxBytes int) bool {
	return m.ByteSize(2) <= maxBytes-outbox.RecordBatchOverhead
}

// messages turns a batch of rows into records, in id order.
func messages(rows []outbox.Row) ([]*sarama.ProducerMessage, error) {
	return newRecordSlab(len(rows)).messages(rows)
}

// messages is messages made from the slab's arrays.
func (s *recordSlab) messages(rows []outbox.Row) ([]*sarama.ProducerMessage, error) {
	ms := s.ptrs[:0]
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
		m, err := s.message(r, feed, epoch)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	s.ptrs = ms
	return ms, nil
}
