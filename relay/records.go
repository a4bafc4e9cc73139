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

// record is a record as the producer writes it into its partition's
// record batch: sarama's own record (key, value, headers; the producer
// sets its deltas when it places it in a batch), with its topic, its
// timestamp in Unix milliseconds and its size as a broker counts it
// (recordSize). An outbox row's record is made straight from the row
// (see recordSlab), with no sarama.ProducerMessage in between.
type record struct {
	rec   sarama.Record
	topic string
	at    int64
	size  int
}

// recordSize is the size a producer counts for rec (record format v2):
// its bytes and the most its framing takes, what sarama's
// ProducerMessage.ByteSize(2) and outbox.RecordBytes say.
func recordSize(rec *sarama.Record) int {
	n := recordOverhead + len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + headerOverhead
	}
	return n
}

// Sizes of a record's framing (format v2), as outbox.RecordBytes counts
// them: five varints of 32 bits, one of 64 and the attributes byte; a
// header's two lengths.
const (
	recordOverhead = 5*5 + 10 + 1
	headerOverhead = 2 * 5
)

// unixMilli is the Unix time in milliseconds of ns Unix nanoseconds, as a
// record batch's timestamp counts it.
func unixMilli(ns int64) int64 { return time.Unix(0, ns).UnixMilli() }

// message turns an outbox row into its record. The record's timestamp is
// the row's creation time, so a republished row carries the same one; the
// relay stamps it with the publish time instead unless Config.Timestamp
// says created (see records). feed and epoch are the row's Feed and Epoch
// as bytes (shared between records: sarama only reads header values).
func message(r *outbox.Row, feed, epoch []byte) (*record, error) {
	return newRecordSlab(1).message(r, feed, epoch)
}

// recordSlab hands out the records of a batch, their headers and header
// pointers and their decimal header values from a few arrays, where each
// record would otherwise cost several allocations. A record keeps its
// batch's arrays alive while the producer holds it. Nothing handed out is
// written again until the slab is reused (see reuse), which the relay does
// only once every record of its batch is settled.
type recordSlab struct {
	ptrs   []*record
	recs   []record
	hdrs   []sarama.RecordHeader
	hptrs  []*sarama.RecordHeader
	digits []byte
}

// relayHeaders is the number of headers the relay adds to each record.
const relayHeaders = 4

// maxDigits is the most bytes of two decimal int64s.
const maxDigits = 2 * 20

func newRecordSlab(n int) *recordSlab {
	return &recordSlab{
		ptrs:   make([]*record, 0, n),
		recs:   make([]record, 0, n),
		hdrs:   make([]sarama.RecordHeader, 0, n*relayHeaders),
		hptrs:  make([]*sarama.RecordHeader, 0, n*relayHeaders),
		digits: make([]byte, 0, n*maxDigits),
	}
}

// reuse returns s emptied when it has room for n records, a new slab
// otherwise (s may be nil). The records s handed out must all be settled
// (committed or acked): their memory is written again. What they pointed
// at (the rows' keys and values) stays reachable until then, one batch at
// most.
func (s *recordSlab) reuse(n int) *recordSlab {
	if s == nil || cap(s.recs) < n {
		return newRecordSlab(n)
	}
	s.ptrs, s.recs, s.hdrs, s.hptrs, s.digits = s.ptrs[:0], s.recs[:0], s.hdrs[:0], s.hptrs[:0], s.digits[:0]
	return s
}

// message is message made from the slab's arrays. The record's key and
// value are the row's own bytes: a nil key stays nil (the partitioner
// hashes any non-nil key, even an empty one, as the Java client does, and
// the batch writes it as null), as does a nil value.
func (s *recordSlab) message(r *outbox.Row, feed, epoch []byte) (*record, error) {
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
	s.recs = append(s.recs, record{topic: r.Topic, at: unixMilli(r.CreatedAt),
		rec: sarama.Record{Key: r.Key, Value: r.Value, Headers: s.pointers(rhs)}})
	m := &s.recs[len(s.recs)-1]
	m.size = recordSize(&m.rec)
	return m, nil
}

// pointers returns pointers to hs, in the slab's pointer array when it has
// room: sarama's record holds its headers by pointer.
func (s *recordSlab) pointers(hs []sarama.RecordHeader) []*sarama.RecordHeader {
	if cap(s.hptrs)-len(s.hptrs) < len(hs) {
		// Doubled, so that the slab, reused, has room for a batch like
		// this one.
		s.hptrs = make([]*sarama.RecordHeader, 0, max(len(hs), 2*cap(s.hptrs)))
	}
	start := len(s.hptrs)
	for i := range hs {
		s.hptrs = append(s.hptrs, &hs[i])
	}
	return s.hptrs[start:len(s.hptrs):len(s.hptrs)]
}

// headers returns an empty slice with room for n headers, within the slab
// when it has that room.
func (s *recordSlab) headers(n int) []sarama.RecordHeader {
	if cap(s.hdrs)-len(s.hdrs) < n {
		s.hdrs = make([]sarama.RecordHeader, 0, max(n, 2*cap(s.hdrs))) // doubled, as in pointers
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
// broker counts it. It is sarama's own measure (recordSize), which the
// producer's batch limit (maxBytes less the batch header) applies to each
// partition's batch (see saramaConfig), so a record that fits is never
// refused by a broker whose limit is maxBytes.
func fits(m *record, maxBytes int) bool {
	return m.size <= maxBytes-outbox.RecordBatchOverhead
}

// messages turns a batch of rows into records, in id order.
func messages(rows []outbox.Row) ([]*record, error) {
	return newRecordSlab(len(rows)).messages(rows)
}

// messages is messages made from the slab's arrays.
func (s *recordSlab) messages(rows []outbox.Row) ([]*record, error) {
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

// producerRecord is the record of m, a message of a tool that produces as
// the relay does (Producer.Publish): its key, value and headers encoded,
// its timestamp, or now when it has none.
func producerRecord(m *sarama.ProducerMessage) (*record, error) {
	key, err := encoded(m.Key)
	if err != nil {
		return nil, fmt.Errorf("encode a record key: %w", err)
	}
	value, err := encoded(m.Value)
	if err != nil {
		return nil, fmt.Errorf("encode a record value: %w", err)
	}
	at := m.Timestamp
	if at.IsZero() {
		at = time.Now()
	}
	rec := &record{topic: m.Topic, at: at.UnixMilli(), rec: sarama.Record{Key: key, Value: value}}
	if len(m.Headers) > 0 {
		rec.rec.Headers = make([]*sarama.RecordHeader, len(m.Headers))
		for i := range m.Headers {
			rec.rec.Headers[i] = &m.Headers[i]
		}
	}
	rec.size = recordSize(&rec.rec)
	return rec, nil
}

// encoded returns the bytes of e; nil stays nil.
func encoded(e sarama.Encoder) ([]byte, error) {
	if e == nil {
		return nil, nil
	}
	b, err := e.Encode()
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return b, nil
}
