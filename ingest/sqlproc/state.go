package sqlproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Slots of the delivery parameters in a bound item, as in deliveryParams.
const (
	slotFeed = iota
	slotPartition
	slotTopic
	slotEpoch
	slotPosition
	slotSequence
	slotAttempt
	slotKey
	slotValue
	slotHeaders
	nDeliverySlots
)

// itemState is one item's bound parameters and the buffers a statement's
// rows are read into. A processor keeps a pool of them, one per Apply
// running.
type itemState struct {
	p     *Processor
	dec   decoder
	vals  []any // per parameter slot, each a value as the store binds it
	argv  []any
	row   []any   // the row just read, the store's (valid until the next)
	cells [4]cell // a row's columns: topic, key, value, headers (reject: reason, error)

	emitCols []string // the emit columns emitAt was found for
	emitAt   [4]int   // per output column, its index in the row, -1 if absent
	hdrs     []outbox.Header

	bad     []badWindow // closed windows whose result is not an output
	failed  *runStmt    // the statement whose error the item's run returned
	verdict error       // the item's failure that is not a statement's
}

func (p *Processor) newState() *itemState {
	return &itemState{p: p, dec: newDecoder(p.plan.cfg), vals: make([]any, len(p.plan.params))}
}

// bind sets the parameters of item d: the delivery's, then the decoded ones
// (an error is the reason the input is malformed). Only the parameters some
// statement uses are computed.
func (s *itemState) bind(d ingest.Delivery, item ingest.Item) error {
	u, v := s.p.used, s.vals
	v[slotFeed] = d.Feed
	v[slotPartition] = int64(d.Partition)
	v[slotTopic] = nil
	if d.Topic != "" {
		v[slotTopic] = d.Topic
	}
	v[slotEpoch] = d.Epoch
	v[slotPosition] = d.Position
	v[slotSequence] = d.Sequence
	v[slotAttempt] = int64(d.Attempt)
	if u[slotKey] {
		v[slotKey] = bytesValue(item.Key)
	}
	if u[slotValue] {
		v[slotValue] = bytesValue(item.Value)
	}
	if u[slotHeaders] {
		v[slotHeaders] = headersJSON(item.Headers)
	}
	return s.dec.decode(item.Value, v[nDeliverySlots:])
}

// bytesValue binds a key or value: NULL when absent, TEXT when UTF-8, a
// BLOB otherwise.
func bytesValue(b []byte) any {
	if b == nil {
		return nil
	}
	return textValue(b)
}

// headersJSON binds headers as a JSON object of strings (bytes that are not
// UTF-8 become U+FFFD; of a repeated key, the last value stands).
func headersJSON(hs []outbox.Header) string {
	if len(hs) == 0 {
		return "{}"
	}
	b := []byte{'{'}
	seen := make(map[string]int, len(hs))
	var vals []string
	var keys []string
	for _, h := range hs {
		if i, ok := seen[h.Key]; ok {
			vals[i] = string(h.Value)
			continue
		}
		seen[h.Key] = len(keys)
		keys = append(keys, h.Key)
		vals = append(vals, string(h.Value))
	}
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		kq, _ := json.Marshal(k)
		vq, _ := json.Marshal(vals[i])
		b = append(append(append(b, kq...), ':'), vq...)
	}
	return string(append(b, '}'))
}

// args are statement r's arguments for the bound item, valid until the
// next call. bind and the decoders give only driver values (int64,
// float64, string, []byte, nil), so none needs converting.
func (s *itemState) args(r *runStmt) []any {
	s.argv = s.argv[:0]
	for _, slot := range r.slots {
		s.argv = append(s.argv, s.vals[slot])
	}
	return s.argv
}

var outputCols = [4]string{ColTopic, ColKey, ColValue, ColHeaders}

// emitDest finds, for a row of the emit statement with columns cols, where
// each output column is. Check made sure the columns are the output's.
func (s *itemState) emitDest(cols []string) error {
	if s.emitCols != nil && slices.Equal(cols, s.emitCols) {
		return nil
	}
	s.emitCols = nil
	s.emitAt = [4]int{-1, -1, -1, -1}
	for i, c := range cols {
		k := slices.Index(outputCols[:], c)
		if k < 0 || s.emitAt[k] >= 0 {
			return fmt.Errorf("column %q: the columns are topic, key, value and headers, once each", c)
		}
		s.emitAt[k] = i
	}
	if s.emitAt[1] < 0 || s.emitAt[2] < 0 {
		return fmt.Errorf("columns %v: no key or no value", cols)
	}
	s.emitCols = append([]string(nil), cols...)
	return nil
}

// fill sets the output cells from the row just read.
func (s *itemState) fill() {
	for k, i := range s.emitAt {
		s.cells[k].v = nil
		if i >= 0 {
			s.cells[k].v = s.row[i]
		}
	}
}

// output is the row just scanned as an output; its slices are valid until
// the next row (Emit copies them).
func (s *itemState) output(defaultTopic string) (outbox.Output, error) {
	var o outbox.Output
	topic := defaultTopic
	if s.emitAt[0] >= 0 && s.cells[0].v != nil {
		t, ok := s.cells[0].v.(string)
		if !ok || t == "" {
			return o, fmt.Errorf("topic %v is not a topic name", s.cells[0].v)
		}
		topic = t
	}
	if topic == "" {
		return o, errors.New("the topic is NULL and the processor has no default topic")
	}
	o.Topic = topic
	var err error
	if s.emitAt[1] >= 0 {
		if o.Key, err = cellBytes(s.cells[1].v); err != nil {
			return o, fmt.Errorf("key: %w", err)
		}
	}
	if o.Value, err = cellBytes(s.cells[2].v); err != nil {
		return o, fmt.Errorf("value: %w", err)
	}
	if s.emitAt[3] >= 0 && s.cells[3].v != nil {
		if o.Headers, err = s.headers(s.cells[3].v); err != nil {
			return o, fmt.Errorf("headers: %w", err)
		}
	}
	return o, nil
}

// cellBytes is a key or value: TEXT and BLOB as they are, an INTEGER as its
// decimal digits, NULL as none. A REAL is refused: its text would depend on
// the formatting; CAST it in the SQL.
func cellBytes(v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return v, nil
	case string:
		if v == "" {
			return []byte{}, nil
		}
		// Emit copies it at once, so the string's bytes are never written.
		return unsafe.Slice(unsafe.StringData(v), len(v)), nil
	case int64:
		return strconv.AppendInt(nil, v, 10), nil
	}
	return nil, fmt.Errorf("%v is REAL: CAST it to TEXT or use printf()", v)
}

// headers reads a JSON object of strings, in its order.
func (s *itemState) headers(v any) ([]outbox.Header, error) {
	var src []byte
	switch v := v.(type) {
	case string:
		src = []byte(v)
	case []byte:
		src = v
	default:
		return nil, fmt.Errorf("%v is not a JSON object", v)
	}
	dec := json.NewDecoder(bytes.NewReader(src))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	s.hdrs = s.hdrs[:0]
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, errors.New("not a JSON object")
		}
		vt, err := dec.Token()
		val, ok := vt.(string)
		if err != nil || !ok {
			return nil, fmt.Errorf("the value of %q is not a string", kt)
		}
		s.hdrs = append(s.hdrs, outbox.Header{Key: kt.(string), Value: []byte(val)})
	}
	if _, err := dec.Token(); err != nil {
		return nil, errors.New("not a JSON object")
	}
	if dec.More() || !utf8.Valid(src) {
		return nil, errors.New("not one JSON object")
	}
	return s.hdrs, nil
}
