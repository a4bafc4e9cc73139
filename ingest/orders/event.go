package orders

import (
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
	if err := json.Unmarshal(value, &w); err != nil {
		return Event{}, ReasonMalformed, fmt.Errorf("the value is not an event: %w", err)
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
