package outbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// PostgreSQL's text holds valid UTF-8 without NUL (in a UTF8 database;
// SQLite's text holds any bytes). What outboxd writes to a text column of
// its own has one of two sources: its own messages, which may quote an
// item's bytes (a dead letter's error, a feed's last error, an
// operator's note), and names an output carries (its topic). The first
// are made fit (pgText): a message must be stored, a byte of it may be
// replaced. The second are refused at Emit with ErrNotText, a constraint
// of the item's (ClassConstraint: the item is dead-lettered with its
// reason, never retried), since an output stored with another topic than
// its processor gave would be another output. A processor's own text
// columns refuse such bytes with PostgreSQL's data exception, SQLSTATE
// class 22, which classifyPG takes for a constraint too.

// ErrNotText marks text PostgreSQL cannot store: bytes that are not
// UTF-8, or a NUL. Classify makes it ClassConstraint.
var ErrNotText = errors.New("not text PostgreSQL can store (invalid UTF-8 or a NUL byte)")

// text is s as the store's engine can keep it in a text column: s itself
// on SQLite, pgText(s) on PostgreSQL.
func (s *Store) text(str string) string {
	if !s.pg {
		return str
	}
	return pgText(str)
}

// pgText is s with each byte that is not UTF-8 replaced by U+FFFD and
// each NUL written \x00.
func pgText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\x00`)
}

// checkPGText returns ErrNotText, naming what, when s is not text
// PostgreSQL can store.
func checkPGText(what, s string) error {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return nil
	}
	return fmt.Errorf("%s %q: %w", what, s, ErrNotText)
}
