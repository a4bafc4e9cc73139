package ingest

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/outboxd/outboxd/outbox"
)

// maxCutError is the most of its error a dead letter's cut copy keeps in
// HeaderError.
const maxCutError = 1 << 10

// deadLetterHeaders are a dead letter's own headers.
type deadLetterHeaders struct {
	reason   string
	err      string
	attempts int
	id       int64
}

// headers returns them, err as given, and HeaderTruncated when cut is set.
func (h deadLetterHeaders) headers(err, cut string) []outbox.Header {
	hs := []outbox.Header{
		{Key: HeaderReason, Value: []byte(h.reason)},
		{Key: HeaderError, Value: []byte(err)},
		{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(h.attempts), 10)},
		{Key: HeaderDeadID, Value: strconv.AppendInt(nil, h.id, 10)},
	}
	if cut != "" {
		hs = append(hs, outbox.Header{Key: HeaderTruncated, Value: []byte(cut)})
	}
	return hs
}

// output is the Kafka copy of the dead letter of item it, emitted at place
// p to topic: the item's key, value and headers, then the dead letter's
// own. When that record would be over limit (as the relay counts it, see
// outbox.PublishedBytes), the copy is cut to fit: the error to maxCutError
// bytes and the value to what room is left (a null value stays null, a text
// is cut between characters); if the key and the headers alone leave no
// room, the item's headers are dropped, and then the key is cut.
// HeaderTruncated says what was cut. Should even the dead letter's own
// headers not fit, the copy goes out over the limit without key or value,
// and the relay keeps it as a dead letter of its own.
func (h deadLetterHeaders) output(p outbox.Place, topic string, it Item, limit int) outbox.Output {
	if limit <= 0 {
		limit = DefaultMaxMessageBytes
	}
	budget := limit - outbox.RecordBatchOverhead
	// An item that was a dead letter before (read from a dead-letter
	// topic) has these headers already: this dead letter's replace them.
	it.Headers = slices.DeleteFunc(slices.Clone(it.Headers), func(h outbox.Header) bool {
		switch h.Key {
		case HeaderReason, HeaderError, HeaderAttempts, HeaderDeadID, HeaderTruncated:
			return true
		}
		return false
	})
	whole := outbox.Output{Topic: topic, Key: it.Key, Value: it.Value, Headers: concat(it.Headers, h.headers(h.err, ""))}
	if outbox.PublishedBytes(p, whole) <= budget {
		return whole
	}
	errMsg, key, item := h.err, it.Key, it.Headers
	var cut []string // what is cut besides the value
	if len(errMsg) > maxCutError {
		errMsg = cutText(errMsg, maxCutError)
		cut = append(cut, "error="+strconv.Itoa(len(h.err)))
	}
	valueCut := func(cut []string) string {
		if len(it.Value) == 0 {
			return strings.Join(cut, ",")
		}
		return strings.Join(append([]string{"value=" + strconv.Itoa(len(it.Value))}, cut...), ",")
	}
	// room is what is left for the value, the value said to be cut.
	room := func(key []byte, item []outbox.Header, cut []string) int {
		hs := concat(item, h.headers(errMsg, valueCut(cut)))
		return budget - outbox.PublishedBytes(p, outbox.Output{Key: key, Headers: hs})
	}
	left := room(key, item, cut)
	if left < 0 && len(item) > 0 {
		cut = append(cut, "headers="+strconv.Itoa(headerBytes(item)))
		item = nil
		left = room(key, item, cut)
	}
	if left < 0 && len(key) > 0 {
		cut = append(cut, "key="+strconv.Itoa(len(key)))
		left = room(nil, item, cut)
		keep := min(max(left, 0), len(key))
		key, left = key[:keep], left-keep
	}
	value := it.Value
	if left < len(value) {
		value = value[:cutBytes(value, max(left, 0))]
		return outbox.Output{Topic: topic, Key: key, Value: value, Headers: concat(item, h.headers(errMsg, valueCut(cut)))}
	}
	// The value fits whole once the rest is cut.
	return outbox.Output{Topic: topic, Key: key, Value: value, Headers: concat(item, h.headers(errMsg, strings.Join(cut, ",")))}
}

// cutBytes is how much of b to keep within n bytes: n, less the start of a
// character it would cut when b is text.
func cutBytes(b []byte, n int) int {
	if n >= len(b) {
		return len(b)
	}
	if !utf8.Valid(b) {
		return n
	}
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return n
}

// cutText is s within n bytes, not cutting a character.
func cutText(s string, n int) string {
	return s[:cutBytes([]byte(s), n)]
}

func headerBytes(hs []outbox.Header) int {
	n := 0
	for _, h := range hs {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func concat(a, b []outbox.Header) []outbox.Header {
	return append(append(make([]outbox.Header, 0, len(a)+len(b)), a...), b...)
}
