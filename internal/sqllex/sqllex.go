// Package sqllex reads SQL text as SQLite's tokenizer does, as far as
// outboxd needs: telling white space and comments, ";", words, named and
// positional parameters and everything else (literals, quoted
// identifiers, operators) apart. The SQL processors split their
// configuration into statements with it (ingest/sqlproc), and the store
// checks a state query with it (outbox.CheckQueryText).
package sqllex

import (
	"errors"
	"fmt"
	"strings"
)

// Kind is what a token is, as far as splitting statements and finding
// parameters needs.
type Kind uint8

// The kinds of token.
const (
	Space    Kind = iota // white space or a comment
	Semi                 // ;
	Word                 // a keyword or bare identifier
	Variable             // :name, @name, $name (SQLite's forms, "$a::b(c)" included)
	Position             // ?, ?NNN
	Other                // literals, quoted identifiers, operators
)

// Token is one token of SQL text.
type Token struct {
	Kind Kind
	Text string
	// Open is set on a block comment that the text ends inside of: SQLite
	// ends it at the end of the text; a caller may refuse it.
	Open bool
}

// ErrUnterminated is returned for a string, quoted identifier or blob that
// the text ends inside of.
var ErrUnterminated = errors.New("unterminated")

// Next returns the token at the start of s, which is not empty. It follows
// SQLite's own tokenizer for comments, the four quoting styles, blob
// literals and the parameter forms; numbers and operators come a byte at a
// time (SQLite's rules for them never hide a ";", a quote or a parameter).
func Next(s string) (Token, error) {
	c := s[0]
	switch {
	case c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r':
		n := 1
		for n < len(s) && strings.IndexByte(" \t\n\f\r", s[n]) >= 0 {
			n++
		}
		return Token{Kind: Space, Text: s[:n]}, nil
	case strings.HasPrefix(s, "--"):
		n := strings.IndexByte(s, '\n')
		if n < 0 {
			n = len(s)
		}
		return Token{Kind: Space, Text: s[:n]}, nil
	case strings.HasPrefix(s, "/*"):
		n := strings.Index(s[2:], "*/")
		if n < 0 {
			return Token{Kind: Space, Text: s, Open: true}, nil
		}
		return Token{Kind: Space, Text: s[:n+4]}, nil
	case c == ';':
		return Token{Kind: Semi, Text: s[:1]}, nil
	case c == '\'' || c == '"' || c == '`':
		n, err := quoted(s, c)
		return Token{Kind: Other, Text: s[:n]}, err
	case c == '[':
		n := strings.IndexByte(s, ']')
		if n < 0 {
			return Token{}, fmt.Errorf("%w [identifier]", ErrUnterminated)
		}
		return Token{Kind: Other, Text: s[:n+1]}, nil
	case (c == 'x' || c == 'X') && len(s) > 1 && s[1] == '\'':
		n, err := quoted(s[1:], '\'')
		return Token{Kind: Other, Text: s[:n+1]}, err
	case c == '?':
		n := 1
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			n++
		}
		return Token{Kind: Position, Text: s[:n]}, nil
	case c == ':' && len(s) > 1 && s[1] == ':':
		// PostgreSQL's cast, x::text: no parameter named text.
		return Token{Kind: Other, Text: s[:2]}, nil
	case c == ':' || c == '@' || c == '$':
		if n := variableLen(s); n > 1 {
			return Token{Kind: Variable, Text: s[:n]}, nil
		}
		return Token{Kind: Other, Text: s[:1]}, nil
	case IsIDChar(c) && !(c >= '0' && c <= '9') && c != '$':
		n := 1
		for n < len(s) && IsIDChar(s[n]) {
			n++
		}
		return Token{Kind: Word, Text: s[:n]}, nil
	default:
		return Token{Kind: Other, Text: s[:1]}, nil
	}
}

// quoted is the length of the quoted token at the start of s, quote q
// doubled inside it for itself.
func quoted(s string, q byte) (int, error) {
	for i := 1; i < len(s); i++ {
		if s[i] != q {
			continue
		}
		if i+1 < len(s) && s[i+1] == q {
			i++
			continue
		}
		return i + 1, nil
	}
	return 0, fmt.Errorf("%w %c...%c", ErrUnterminated, q, q)
}

// variableLen is the length of the named parameter at the start of s (1 if
// there is none). SQLite lets a "$" name go on with "::" and a "(...)" suffix.
func variableLen(s string) int {
	n := 1
	for n < len(s) {
		switch {
		case IsIDChar(s[n]):
			n++
		case s[0] == '$' && strings.HasPrefix(s[n:], "::"):
			n += 2
		case s[0] == '$' && s[n] == '(' && n > 1:
			end := strings.IndexByte(s[n:], ')')
			if end < 0 {
				return n
			}
			return n + end + 1
		default:
			return n
		}
	}
	return n
}

// IsIDChar is SQLite's rule for the bytes of an identifier: letters, digits,
// "_", "$" and every byte of a multi-byte UTF-8 character.
func IsIDChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$' || c >= 0x80
}
