package sqlproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// decoder turns an item's value into the values of the decoded parameters,
// written to dst (one per decoded name, in order). An error is the reason
// the item is malformed.
type decoder interface {
	decode(value []byte, dst []any) error
}

func newDecoder(c Config) decoder {
	switch c.Input {
	case InputCSV:
		d, _ := c.delimiter()
		dec := &csvDecoder{columns: len(c.Columns), delim: d, quotes: c.Quoting != QuotingNone, trim: c.Trim}
		for _, col := range c.Columns {
			dec.text = append(dec.text, slices.Contains(c.Text, col))
		}
		return dec
	case InputJSON:
		names, _ := c.jsonNames()
		j := &jsonDecoder{}
		for _, n := range names {
			path, _ := parsePath(c.Fields[n])
			j.fields = append(j.fields, jsonField{name: n, path: path, required: slices.Contains(c.Required, n)})
		}
		return j
	}
	return rawDecoder{}
}

type rawDecoder struct{}

func (rawDecoder) decode([]byte, []any) error { return nil }

// textValue binds b as TEXT when it is UTF-8, as a BLOB when it is not, so
// that no byte of the input is lost or replaced.
func textValue(b []byte) any {
	if utf8.Valid(b) {
		return string(b)
	}
	return b
}

// csvDecoder reads one CSV record: unquoted fields that are base-10
// integers (strconv.ParseInt's syntax) bind as INTEGER, other fields as TEXT
// (a BLOB when not UTF-8); a quoted field, or one of a Text column, is
// never a number.
type csvDecoder struct {
	columns int
	delim   byte
	quotes  bool
	trim    bool
	text    []bool // per column: always TEXT
	buf     []byte // a quoted field being assembled
}

func (d *csvDecoder) decode(line []byte, dst []any) error {
	n := 0
	rest := line
	for {
		field, quoted, tail, more, err := d.field(rest)
		if err != nil {
			return fmt.Errorf("field %d: %v", n+1, err)
		}
		if n < d.columns {
			dst[n] = d.value(field, quoted || d.text[n])
		}
		n++
		if !more {
			break
		}
		rest = tail
	}
	if n != d.columns {
		return fmt.Errorf("%d fields, want %d", n, d.columns)
	}
	return nil
}

// field cuts the first field off s: its bytes, whether it was quoted, what
// follows its delimiter, and whether a delimiter followed it.
func (d *csvDecoder) field(s []byte) (field []byte, quoted bool, tail []byte, more bool, err error) {
	start := s
	if d.trim {
		start = bytes.TrimLeftFunc(s, unicode.IsSpace)
	}
	if d.quotes && len(start) > 0 && start[0] == '"' {
		return d.quotedField(start)
	}
	i := bytes.IndexByte(s, d.delim)
	field, more = s, i >= 0
	if more {
		field, tail = s[:i], s[i+1:]
	}
	if d.quotes && bytes.IndexByte(field, '"') >= 0 {
		return nil, false, nil, false, errors.New(`a quote in an unquoted field`)
	}
	if d.trim {
		field = bytes.TrimSpace(field)
	}
	return field, false, tail, more, nil
}

// quotedField reads the quoted field at the start of s ("a ""b"" c").
func (d *csvDecoder) quotedField(s []byte) ([]byte, bool, []byte, bool, error) {
	d.buf = d.buf[:0]
	i := 1
	for {
		j := bytes.IndexByte(s[i:], '"')
		if j < 0 {
			return nil, false, nil, false, errors.New("a quoted field without its closing quote")
		}
		d.buf = append(d.buf, s[i:i+j]...)
		i += j + 1
		if i < len(s) && s[i] == '"' {
			d.buf = append(d.buf, '"')
			i++
			continue
		}
		break
	}
	after := s[i:]
	if d.trim {
		after = bytes.TrimLeftFunc(after, unicode.IsSpace)
	}
	switch {
	case len(after) == 0:
		return d.buf, true, nil, false, nil
	case after[0] == d.delim:
		return d.buf, true, after[1:], true, nil
	}
	return nil, false, nil, false, errors.New("text after a quoted field's closing quote")
}

func (d *csvDecoder) value(field []byte, text bool) any {
	if !text && len(field) > 0 {
		if c := field[0]; c >= '0' && c <= '9' || c == '-' || c == '+' {
			if n, err := strconv.ParseInt(string(field), 10, 64); err == nil {
				return n
			}
		}
	}
	return textValue(field)
}

// jsonDecoder picks fields out of a JSON document by path.
type jsonDecoder struct {
	fields []jsonField
}

type jsonField struct {
	name     string
	path     []pathStep
	required bool
}

func (d *jsonDecoder) decode(doc []byte, dst []any) error {
	if !json.Valid(doc) {
		return errors.New("not a JSON document")
	}
	for i, f := range d.fields {
		raw, ok := lookup(json.RawMessage(doc), f.path)
		if !ok {
			if f.required {
				return fmt.Errorf("no field %s (%s)", f.name, formatPath(f.path))
			}
			dst[i] = nil
			continue
		}
		dst[i] = jsonValue(raw)
	}
	return nil
}

// jsonValue binds a JSON value: a string as TEXT, an integer that fits 64
// bits as INTEGER, another number as REAL (as its text when it is beyond
// float64 too), true and false as 1 and 0, null as NULL, an object or
// array as its JSON text.
func jsonValue(raw json.RawMessage) any {
	raw = bytes.TrimSpace(raw)
	switch raw[0] {
	case '"':
		var s string
		_ = json.Unmarshal(raw, &s) // valid: the document was checked
		return s
	case 't':
		return int64(1)
	case 'f':
		return int64(0)
	case 'n':
		return nil
	case '{', '[':
		var b bytes.Buffer
		_ = json.Compact(&b, raw)
		return b.String()
	}
	s := string(raw)
	if bytes.IndexAny(raw, ".eE") < 0 {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return n
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return f
	}
	return s
}

// pathStep is one step of a JSON path: an object's member or an array's
// element.
type pathStep struct {
	key   string
	index int // when key is "" and isIndex
	isIdx bool
}

// parsePath reads "$", "$.a.b", "a.b", "$.a[2]", `$["a b"].c`.
func parsePath(p string) ([]pathStep, error) {
	s := p
	if rest, ok := strings.CutPrefix(s, "$"); ok {
		s = rest
	} else if s != "" && s[0] != '.' && s[0] != '[' {
		s = "." + s
	}
	var steps []pathStep
	for s != "" {
		switch s[0] {
		case '.':
			end := 1
			for end < len(s) && s[end] != '.' && s[end] != '[' {
				end++
			}
			if end == 1 {
				return nil, errors.New("an empty member name")
			}
			steps = append(steps, pathStep{key: s[1:end]})
			s = s[end:]
		case '[':
			step, rest, err := bracketStep(s)
			if err != nil {
				return nil, err
			}
			steps = append(steps, step)
			s = rest
		default:
			return nil, fmt.Errorf("%q: want .member or [index]", s)
		}
	}
	return steps, nil
}

// bracketStep reads `[3]` or `["key"]` at the start of s.
func bracketStep(s string) (pathStep, string, error) {
	if len(s) > 1 && s[1] == '"' {
		dec := json.NewDecoder(bytes.NewReader([]byte(s[1:])))
		var key string
		if err := dec.Decode(&key); err != nil {
			return pathStep{}, "", fmt.Errorf("%q: a bad quoted member name", s)
		}
		rest := s[1+int(dec.InputOffset()):]
		if rest == "" || rest[0] != ']' {
			return pathStep{}, "", fmt.Errorf("%q: want ] after the member name", s)
		}
		return pathStep{key: key}, rest[1:], nil
	}
	end := 1
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	if end == 1 || end >= len(s) || s[end] != ']' || end > 10 {
		return pathStep{}, "", fmt.Errorf("%q: want [index] or [\"member\"]", s)
	}
	n, _ := strconv.Atoi(s[1:end])
	return pathStep{index: n, isIdx: true}, s[end+1:], nil
}

func formatPath(steps []pathStep) string {
	b := []byte{'$'}
	for _, s := range steps {
		switch {
		case s.isIdx:
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(s.index), 10)
			b = append(b, ']')
		case isPlainKey(s.key):
			b = append(b, '.')
			b = append(b, s.key...)
		default:
			q, _ := json.Marshal(s.key)
			b = append(b, '[')
			b = append(b, q...)
			b = append(b, ']')
		}
	}
	return string(b)
}

func isPlainKey(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c == '.' || c == '[' || c == ']' || c == '"' || c < 0x20 {
			return false
		}
	}
	return k != ""
}

// lookup follows path from doc, a valid JSON value.
func lookup(doc json.RawMessage, path []pathStep) (json.RawMessage, bool) {
	cur := doc
	for _, s := range path {
		if s.isIdx {
			var arr []json.RawMessage
			if json.Unmarshal(cur, &arr) != nil || s.index >= len(arr) {
				return nil, false
			}
			cur = arr[s.index]
			continue
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(cur, &obj) != nil {
			return nil, false
		}
		v, ok := obj[s.key]
		if !ok {
			return nil, false
		}
		cur = v
	}
	return cur, true
}
