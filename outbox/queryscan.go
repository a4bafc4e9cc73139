package outbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// scanQuery reads text as SQLite's tokenizer would, as far as a query's
// check needs: it must be one statement (a ';' may only end it), start
// with SELECT, VALUES or WITH (and then its main statement, the first
// verb outside the common table expressions' parentheses, must be SELECT
// or VALUES: WITH x AS (...) DELETE ... writes), and name its parameters
// (:name, @name, $name; a '?' is refused, since HTTP parameters are
// named). It returns the parameters' names, in the order they first
// appear.
func scanQuery(text string) ([]string, error) {
	var params []string
	first, ended := "", false
	// After WITH: the parentheses' depth, the main verb once seen, and
	// whether the last word was REPLACE (a verb only before INTO: it may
	// also name a common table expression).
	depth, verb, replace := 0, "", false
	for i := 0; i < len(text); {
		c := text[i]
		n, err := skipToken(text[i:])
		if err != nil {
			return nil, err
		}
		if n > 0 { // a space, a comment, a string or a quoted name
			i += n
			continue
		}
		if ended {
			return nil, errors.New("more than one statement (a query is one SELECT)")
		}
		switch {
		case c == ';':
			ended = true
			i++
		case c == '?':
			return nil, errors.New("a positional parameter '?': name each parameter (:name)")
		case (c == ':' || c == '@' || c == '$') && i+1 < len(text) && isNameChar(text[i+1]):
			j := i + 1
			for j < len(text) && isNameChar(text[j]) {
				j++
			}
			name := text[i+1 : j]
			if name[0] >= '0' && name[0] <= '9' {
				return nil, fmt.Errorf("parameter %c%s: a name starts with a letter or '_'", c, name)
			}
			if !slices.Contains(params, name) {
				params = append(params, name)
			}
			i = j
		case isNameChar(c):
			j := i
			for j < len(text) && (isNameChar(text[j]) || text[j] == '$') { // a$b is one name
				j++
			}
			word := strings.ToUpper(text[i:j])
			if first == "" {
				first = word
			} else if first == "WITH" && depth == 0 && verb == "" {
				switch {
				case replace && word == "INTO":
					verb = "REPLACE"
				case word == "SELECT" || word == "VALUES" || word == "INSERT" || word == "UPDATE" || word == "DELETE":
					verb = word
				}
				replace = word == "REPLACE"
			}
			i = j
		default:
			if first == "" {
				first = string(c)
			}
			switch c {
			case '(':
				depth++
			case ')':
				depth--
			}
			replace = false
			i++
		}
	}
	switch first {
	case "WITH":
		if verb != "" && verb != "SELECT" && verb != "VALUES" {
			return nil, fmt.Errorf("WITH ... %s: a query is a SELECT, VALUES or WITH ... SELECT", verb)
		}
		return params, nil
	case "SELECT", "VALUES":
		return params, nil
	case "":
		return nil, errors.New("no statement")
	}
	return nil, fmt.Errorf("starts with %s: a query is a SELECT, VALUES or WITH ... SELECT", first)
}

// skipToken returns the length of the space, comment, string literal or
// quoted identifier s starts with, 0 when it starts with none of them.
func skipToken(s string) (int, error) {
	switch {
	case s[0] == ' ' || s[0] == '\t' || s[0] == '\n' || s[0] == '\r' || s[0] == '\f':
		return 1, nil
	case strings.HasPrefix(s, "--"):
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			return i + 1, nil
		}
		return len(s), nil
	case strings.HasPrefix(s, "/*"):
		if i := strings.Index(s[2:], "*/"); i >= 0 {
			return i + 4, nil
		}
		return len(s), nil // SQLite ends an unterminated comment at the end
	case s[0] == '\'' || s[0] == '"' || s[0] == '`':
		return quotedLen(s, s[0])
	case s[0] == '[':
		if i := strings.IndexByte(s, ']'); i >= 0 {
			return i + 1, nil
		}
		return 0, errors.New("an unterminated [name]")
	}
	return 0, nil
}

// quotedLen is the length of the token quoted by q at s's start, a doubled
// q standing for itself.
func quotedLen(s string, q byte) (int, error) {
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
	return 0, fmt.Errorf("an unterminated %c", q)
}

func isNameChar(c byte) bool {
	return c == '_' || c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// CheckQueryText checks, without a database, what PrepareQuery checks
// first: that text is one SELECT, VALUES or WITH statement whose
// parameters are named. It returns the parameters' names.
func CheckQueryText(text string) ([]string, error) {
	params, err := scanQuery(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrQueryRefused, err)
	}
	return params, nil
}
