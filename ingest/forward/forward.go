// Package forward is the built-in processor that ships each line of a feed
// to a topic unchanged, exactly once.
package forward

import (
	"context"
	"errors"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Name is the processor's name on the command line.
const Name = "forward"

// Processor emits each item's value unchanged. With a key field it keys the
// output by that CSV field of the line; otherwise it keeps the item's own
// key (none for a file line).
type Processor struct {
	topic    string
	keyField int
}

var _ ingest.Processor = (*Processor)(nil)

// New returns a forward processor emitting to topic. keyField is the 1-based
// CSV field used as the key, or 0 for none.
func New(topic string, keyField int) *Processor { return &Processor{topic: topic, keyField: keyField} }

// Apply emits the item.
func (p *Processor) Apply(ctx context.Context, tx *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
	key := item.Key
	if p.keyField > 0 {
		k, err := Field(item.Value, p.keyField)
		if err != nil {
			return ingest.Permanent(ingest.ReasonMalformed, err)
		}
		key = k
	}
	return tx.Emit(ctx, outbox.Output{Topic: p.topic, Key: key, Value: item.Value, Headers: item.Headers})
}

// Field returns the n-th (1-based) comma-separated field of line. A field
// in double quotes may hold commas and doubled quotes (""), as in RFC 4180.
func Field(line []byte, n int) ([]byte, error) {
	rest := line
	for i := 1; ; i++ {
		f, next, err := nextField(rest)
		if err != nil {
			return nil, err
		}
		if i == n {
			return f, nil
		}
		if next == nil {
			return nil, errors.New("the line has fewer fields than the key field")
		}
		rest = next
	}
}

// nextField splits off the first field; next is nil after the last field.
func nextField(s []byte) (field, next []byte, err error) {
	if len(s) == 0 || s[0] != '"' {
		for i, c := range s {
			if c == ',' {
				return s[:i], s[i+1:], nil
			}
		}
		return s, nil, nil
	}
	out := []byte{}
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			out = append(out, s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			out = append(out, '"')
			i++
			continue
		}
		switch {
		case i+1 == len(s):
			return out, nil, nil
		case s[i+1] == ',':
			return out, s[i+2:], nil
		default:
			return nil, nil, errors.New("text after a closing quote")
		}
	}
	return nil, nil, errors.New("unterminated quoted field")
}
