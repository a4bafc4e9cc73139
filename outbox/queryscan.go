package outbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/internal/sqllex"
)

// scanQuery reads text as SQLite's tokenizer would (internal/sqllex), as
// far as a query's check needs: it must be one statement (a ';' may only
// end it), start with SELECT, VALUES or WITH (and then its main statement,
// the first verb outside the common table expressions' parentheses, must
// be SELECT or VALUES: WITH x AS (...) DELETE ... writes), and name its
// parameters (:name, @name, $name; a '?' is refused, since HTTP
// parameters are named). It returns the parameters' names, in the order
// they first appear.
func scanQuery(text string) ([]string, error) {
	var params []string
	first, ended := "", false
	// After WITH: the parentheses' depth, the main verb once seen, and
	// whether the last word was REPLACE (a verb only before INTO: it may
	// also name a common table expression).
	depth, verb, replace := 0, "", false
	for i := 0; i < len(text); {
		t, err := sqllex.Next(text[i:])
		if err != nil {
			return nil, fmt.Errorf("at byte %d: %w", i, err)
		}
		i += len(t.Text)
		if t.Kind == sqllex.Space { // SQLite ends an open comment at the end
			continue
		}
		if ended {
			return nil, errors.New("more than one statement (a query is one SELECT)")
		}
		switch t.Kind {
		case sqllex.Semi:
			ended = true
		case sqllex.Position:
			return nil, errors.New("a positional parameter '?': name each parameter (:name)")
		case sqllex.Variable:
			name := t.Text[1:]
			if name[0] >= '0' && name[0] <= '9' {
				return nil, fmt.Errorf("parameter %s: a name starts with a letter or '_'", t.Text)
			}
			if !slices.Contains(params, name) {
				params = append(params, name)
			}
		case sqllex.Word:
			word := strings.ToUpper(t.Text)
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
		default:
			if first == "" {
				first = t.Text
			}
			switch t.Text {
			case "(":
				depth++
			case ")":
				depth--
			}
			replace = false
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
