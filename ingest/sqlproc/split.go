package sqlproc

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/internal/sqllex"
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
func (st splitState) step(t sqllex.Token) splitState {
	return completeTable[st][classOf(t)]
}

func classOf(t sqllex.Token) int {
	switch t.Kind {
	case sqllex.Semi:
		return ccSemi
	case sqllex.Space:
		return ccSpace
	case sqllex.Word:
		switch strings.ToUpper(t.Text) {
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
		t, err := sqllex.Next(src[i:])
		if err == nil && t.Open {
			err = fmt.Errorf("%w comment", sqllex.ErrUnterminated)
		}
		if err != nil {
			return nil, fmt.Errorf("at byte %d: %w", i, err)
		}
		next := st.step(t)
		if t.Kind != sqllex.Space {
			if cur == nil && t.Kind != sqllex.Semi {
				out = append(out, statement{})
				cur, start = &out[len(out)-1], i
			}
			if cur != nil && !(t.Kind == sqllex.Semi && next == stStart) {
				cur.add(t, i-start)
				end = i + len(t.Text)
			}
		}
		if t.Kind == sqllex.Semi && next == stStart && cur != nil {
			cur.text, cur = src[start:end], nil
		}
		st = next
		i += len(t.Text)
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
func (s *statement) add(t sqllex.Token, at int) {
	switch t.Kind {
	case sqllex.Word:
		if strings.EqualFold(t.Text, "ROLLBACK") && s.refused == "" {
			s.refused = t.Text
		}
	case sqllex.Variable:
		name := t.Text[1:]
		i := slices.Index(s.params, name)
		if i < 0 {
			i = len(s.params)
			s.params = append(s.params, name)
		}
		s.uses = append(s.uses, paramUse{at: at, end: at + len(t.Text), index: i})
	case sqllex.Position:
		if s.refused == "" {
			s.refused = t.Text
		}
	}
}
