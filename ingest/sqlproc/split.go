package sqlproc

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// statement is one SQL statement of a configuration, as SQLite will see it.
type statement struct {
	text   string     // from its first token to its last, without the ";"
	params []string   // the names of its parameters (":name", "@name", "$name"), first use first, without the prefix
	uses   []paramUse // where the parameters are, in text order
	// refused is the first token a configuration may not use, "" if none:
	// a positional parameter, or ROLLBACK (a conflict resolution that would
	// end the engine's transaction, not just the statement).
	refused string
}

// paramUse is one occurrence of a named parameter in a statement's text.
type paramUse struct {
	at, end int // byte offsets in text
	index   int // in params
}

// positional is the statement's text with each named parameter replaced by
// ?N, N its place in params (from 1): SQLite binds it the same, and the
// driver finds a positional argument without comparing names.
func (s statement) positional() string {
	var b strings.Builder
	last := 0
	for _, u := range s.uses {
		b.WriteString(s.text[last:u.at])
		b.WriteString("?")
		b.WriteString(strconv.Itoa(u.index + 1))
		last = u.end
	}
	b.WriteString(s.text[last:])
	return b.String()
}

// tokenKind is what the statement splitter needs to tell tokens apart.
type tokenKind uint8

const (
	tokSpace    tokenKind = iota // white space or a comment
	tokSemi                      // ;
	tokWord                      // a keyword or bare identifier
	tokVariable                  // :name, @name, $name
	tokPosition                  // ?, ?NNN
	tokOther                     // literals, quoted identifiers, operators
)

type token struct {
	kind tokenKind
	text string
}

// errUnterminated is returned for a string, quoted identifier or block
// comment that the text ends inside of.
var errUnterminated = errors.New("unterminated")

// nextToken returns the token at the start of s, which is not empty. It
// follows SQLite's own tokenizer as far as splitting statements and finding
// parameters needs: comments, the four quoting styles, blob literals and the
// parameter forms.
func nextToken(s string) (token, error) {
	c := s[0]
	switch {
	case c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r':
		n := 1
		for n < len(s) && strings.IndexByte(" \t\n\f\r", s[n]) >= 0 {
			n++
		}
		return token{tokSpace, s[:n]}, nil
	case strings.HasPrefix(s, "--"):
		n := strings.IndexByte(s, '\n')
		if n < 0 {
			n = len(s)
		}
		return token{tokSpace, s[:n]}, nil
	case strings.HasPrefix(s, "/*"):
		n := strings.Index(s[2:], "*/")
		if n < 0 {
			return token{}, fmt.Errorf("%w comment", errUnterminated)
		}
		return token{tokSpace, s[:n+4]}, nil
	case c == ';':
		return token{tokSemi, s[:1]}, nil
	case c == '\'' || c == '"' || c == '`':
		n, err := quoted(s, c)
		return token{tokOther, s[:n]}, err
	case c == '[':
		n := strings.IndexByte(s, ']')
		if n < 0 {
			return token{}, fmt.Errorf("%w [identifier]", errUnterminated)
		}
		return token{tokOther, s[:n+1]}, nil
	case (c == 'x' || c == 'X') && len(s) > 1 && s[1] == '\'':
		n, err := quoted(s[1:], '\'')
		return token{tokOther, s[:n+1]}, err
	case c == '?':
		n := 1
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			n++
		}
		return token{tokPosition, s[:n]}, nil
	case c == ':' || c == '@' || c == '$':
		if n := variableLen(s); n > 1 {
			return token{tokVariable, s[:n]}, nil
		}
		return token{tokOther, s[:1]}, nil
	case isIDChar(c) && !(c >= '0' && c <= '9') && c != '$':
		n := 1
		for n < len(s) && isIDChar(s[n]) {
			n++
		}
		return token{tokWord, s[:n]}, nil
	default:
		// Numbers and operators: SQLite's rules for them never hide a ";",
		// a quote or a parameter, so one byte at a time is enough.
		return token{tokOther, s[:1]}, nil
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
	return 0, fmt.Errorf("%w %c...%c", errUnterminated, q, q)
}

// variableLen is the length of the named parameter at the start of s (1 if
// there is none). SQLite lets a "$" name go on with "::" and a "(...)" suffix.
func variableLen(s string) int {
	n := 1
	for n < len(s) {
		switch {
		case isIDChar(s[n]):
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

// isIDChar is SQLite's rule for the bytes of an identifier: letters, digits,
// "_", "$" and every byte of a multi-byte UTF-8 character.
func isIDChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$' || c >= 0x80
}

// Where a statement stands, as sqlite3_complete follows it: a ";" ends a
// statement, except inside CREATE [TEMP] TRIGGER ... BEGIN ... END, whose
// body holds statements of its own.
type splitState uint8

const (
	stInvalid splitState = iota // not used: sqlite3_complete's state before any token
	stStart                     // before a statement's first token
	stNormal                    // inside an ordinary statement
	stExplain                   // after EXPLAIN
	stCreate                    // after CREATE [TEMP]
	stTrigger                   // inside a trigger's body
	stSemi                      // after a ";" inside a trigger's body
	stEnd                       // after "; END" inside a trigger's body: the next ";" ends it
)

// Token classes of sqlite3_complete's table.
const (
	ccSemi = iota
	ccSpace
	ccOther
	ccExplain
	ccCreate
	ccTemp
	ccTrigger
	ccEnd
)

// completeTable is sqlite3_complete's transition table: the next state,
// by state and token class.
var completeTable = [8][8]splitState{
	//              SEMI      WS         OTHER      EXPLAIN    CREATE     TEMP       TRIGGER    END
	stInvalid: {stStart, stInvalid, stNormal, stExplain, stCreate, stNormal, stNormal, stNormal},
	stStart:   {stStart, stStart, stNormal, stExplain, stCreate, stNormal, stNormal, stNormal},
	stNormal:  {stStart, stNormal, stNormal, stNormal, stNormal, stNormal, stNormal, stNormal},
	stExplain: {stStart, stExplain, stExplain, stNormal, stCreate, stNormal, stNormal, stNormal},
	stCreate:  {stStart, stCreate, stNormal, stNormal, stNormal, stCreate, stTrigger, stNormal},
	stTrigger: {stSemi, stTrigger, stTrigger, stTrigger, stTrigger, stTrigger, stTrigger, stTrigger},
	stSemi:    {stSemi, stSemi, stTrigger, stTrigger, stTrigger, stTrigger, stTrigger, stEnd},
	stEnd:     {stStart, stEnd, stTrigger, stTrigger, stTrigger, stTrigger, stTrigger, stTrigger},
}

// step is the state after token t.
func (st splitState) step(t token) splitState {
	return completeTable[st][classOf(t)]
}

func classOf(t token) int {
	switch t.kind {
	case tokSemi:
		return ccSemi
	case tokSpace:
		return ccSpace
	case tokWord:
		switch strings.ToUpper(t.text) {
		case "EXPLAIN":
			return ccExplain
		case "CREATE":
			return ccCreate
		case "TEMP", "TEMPORARY":
			return ccTemp
		case "TRIGGER":
			return ccTrigger
		case "END":
			return ccEnd
		}
	}
	return ccOther
}

// split cuts SQL text into its statements. Empty statements (";;", or only
// comments) are dropped; the last statement needs no ";". It fails on text
// that ends inside a string, a quoted identifier, a comment or a trigger's
// body.
func split(src string) ([]statement, error) {
	var out []statement
	var cur *statement
	start, end := 0, 0 // the current statement's first token and the end of its last
	st := stStart
	for i := 0; i < len(src); {
		t, err := nextToken(src[i:])
		if err != nil {
			return nil, fmt.Errorf("at byte %d: %w", i, err)
		}
		next := st.step(t)
		if t.kind != tokSpace {
			if cur == nil && t.kind != tokSemi {
				out = append(out, statement{})
				cur, start = &out[len(out)-1], i
			}
			if cur != nil && !(t.kind == tokSemi && next == stStart) {
				cur.add(t, i-start)
				end = i + len(t.text)
			}
		}
		if t.kind == tokSemi && next == stStart && cur != nil {
			cur.text, cur = src[start:end], nil
		}
		st = next
		i += len(t.text)
	}
	switch st {
	case stTrigger, stSemi:
		return nil, errors.New("CREATE TRIGGER without its END")
	}
	if cur != nil {
		cur.text = src[start:end]
	}
	return out, nil
}

// add takes a token of the statement into account.
func (s *statement) add(t token, at int) {
	switch t.kind {
	case tokWord:
		if strings.EqualFold(t.text, "ROLLBACK") && s.refused == "" {
			s.refused = t.text
		}
	case tokVariable:
		name := t.text[1:]
		i := slices.Index(s.params, name)
		if i < 0 {
			i = len(s.params)
			s.params = append(s.params, name)
		}
		s.uses = append(s.uses, paramUse{at: at, end: at + len(t.text), index: i})
	case tokPosition:
		if s.refused == "" {
			s.refused = t.text
		}
	}
}
