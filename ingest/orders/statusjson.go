package orders

import (
	"encoding/json"
	"time"
	"unicode/utf8"
)

// appendStatusChange appends c as json.Marshal encodes it, byte for byte,
// without its reflection: a status change per event made encoding/json a
// tenth of an event's CPU. Text json.Marshal would escape (a quote, a
// backslash, a control character, <, >, &, U+2028, U+2029, bytes that are
// not UTF-8) and a time it refuses (a year outside 0-9999) go through
// json.Marshal itself.
func appendStatusChange(b []byte, c StatusChange) ([]byte, error) {
	at := c.At
	if y := at.Year(); !plainJSON(c.OrderID) || !plainJSON(string(c.Status)) || !plainJSON(string(c.Previous)) ||
		y < 0 || y > 9999 {
		v, err := json.Marshal(c)
		return append(b, v...), err
	}
	b = append(b, `{"order_id":"`...)
	b = append(b, c.OrderID...)
	b = append(b, `","status":"`...)
	b = append(b, c.Status...)
	b = append(b, `","previous":"`...)
	b = append(b, c.Previous...)
	b = append(b, `","at":"`...)
	b = at.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...), nil
}

// plainJSON reports whether json.Marshal writes s as it is, between its
// quotes. U+FFFD itself is taken for a byte that is not UTF-8 (which
// json.Marshal writes as \ufffd): the slow path encodes both right.
func plainJSON(s string) bool {
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
			return false
		}
		i += n
	}
	return true
}
