package orders

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/ingest"
)

// Reasons the processor dead-letters an event for.
const (
	// ReasonMalformed: no key, a value that is not a JSON event, no type,
	// no at; or a retry record without its original place.
	ReasonMalformed = ingest.ReasonMalformed
	// ReasonUnknownType: a type the state machine does not know.
	ReasonUnknownType = "unknown-type"
	// ReasonInvalidTransition: the state machine still refused the order's
	// history with the event after its retries were spent.
	ReasonInvalidTransition = "invalid-transition"
)

// Place is where an event was first read: its topic, Kafka partition, feed
// epoch (which names the topic's incarnation and the partition) and offset.
// An event is applied at most once per place, however often it comes back.
type Place struct {
	Topic     string
	Partition int32
	Epoch     string
	Offset    int64
}

func (p Place) compare(o Place) int {
	return cmp.Or(cmp.Compare(p.Epoch, o.Epoch), cmp.Compare(p.Offset, o.Offset))
}

// Event is one decoded order event.
type Event struct {
	OrderID string
	Type    string
	At      time.Time
	Place   Place
}

// wireEvent is the JSON value of an event; other fields are ignored.
type wireEvent struct {
	Type string    `json:"type"`
	At   time.Time `json:"at"`
}

// decodePlain decodes value when it is written exactly as
// {"type":"T","at":"A"}, T printable ASCII and neither holding a quote or
// a backslash, as json.Unmarshal would (the time through the same
// UnmarshalJSON), without its reflection: the events' JSON was a sixth of
// an event's CPU. It reports false, leaving w as it was, for any other
// value, which json.Unmarshal then decodes (or refuses).
func (w *wireEvent) decodePlain(value []byte) bool {
	const head, mid, tail = `{"type":"`, `","at":`, `}`
	v, ok := bytes.CutPrefix(value, []byte(head))
	if !ok {
		return false
	}
	i := bytes.IndexByte(v, '"')
	if i < 0 {
		return false
	}
	typ := v[:i]
	for _, c := range typ {
		if c < 0x20 || c >= 0x7f || c == '\\' {
			return false
		}
	}
	at, ok := bytes.CutPrefix(v[i:], []byte(mid))
	if !ok {
		return false
	}
	if at, ok = bytes.CutSuffix(at, []byte(tail)); !ok || len(at) < 2 || at[0] != '"' || at[len(at)-1] != '"' ||
		bytes.IndexByte(at[1:len(at)-1], '"') >= 0 || bytes.IndexByte(at, '\\') >= 0 {
		return false
	}
	var t time.Time
	if err := t.UnmarshalJSON(at); err != nil {
		return false // json.Unmarshal says why
	}
	w.Type, w.At = string(typ), t
	return true
}

// Decode reads an event from a record: the key is the order id, the value a
// JSON object with "type" and "at" (RFC 3339). It returns the reason to
// dead-letter the record for with the error: ReasonMalformed for no key, a
// value that is not a JSON object of that shape, no type or no at;
// ReasonUnknownType for a type the state machine does not know. The event's
// Place is left to the caller.
func Decode(key, value []byte) (Event, string, error) {
	if len(key) == 0 {
		return Event{}, ReasonMalformed, errors.New("the record has no key")
	}
	var w wireEvent
	if !w.decodePlain(value) {
		if err := json.Unmarshal(value, &w); err != nil {
			return Event{}, ReasonMalformed, fmt.Errorf("the value is not an event: %w", err)
		}
	}
	if w.Type == "" {
		return Event{}, ReasonMalformed, errors.New("the event has no type")
	}
	if w.At.IsZero() {
		return Event{}, ReasonMalformed, errors.New("the event has no at")
	}
	if !KnownType(w.Type) {
		return Event{}, ReasonUnknownType, fmt.Errorf("the event type %q is not one the order state machine knows", w.Type)
	}
	return Event{OrderID: string(key), Type: w.Type, At: w.At.UTC()}, "", nil
}
