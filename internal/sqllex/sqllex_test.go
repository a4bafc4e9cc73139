package sqllex_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/internal/sqllex"
)

// tokens reads all of src; it stops at the first error.
func tokens(src string) ([]sqllex.Token, error) {
	var out []sqllex.Token
	for i := 0; i < len(src); {
		t, err := sqllex.Next(src[i:])
		if err != nil {
			return out, err
		}
		out = append(out, t)
		i += len(t.Text)
	}
	return out, nil
}

func tok(k sqllex.Kind, text string) sqllex.Token { return sqllex.Token{Kind: k, Text: text} }

// TestNext covers what both users need: the statement splitter (";",
// words, quotes and comments that hide a ";") and the query check (named
// and positional parameters, words, an open comment at the end).
func TestNext(t *testing.T) {
	const (
		sp  = sqllex.Space
		se  = sqllex.Semi
		w   = sqllex.Word
		v   = sqllex.Variable
		pos = sqllex.Position
		o   = sqllex.Other
	)
	for _, c := range []struct {
		name string
		src  string
		want []sqllex.Token
	}{
		{"Statement", "SELECT 1;", []sqllex.Token{tok(w, "SELECT"), tok(sp, " "), tok(o, "1"), tok(se, ";")}},
		{"SemicolonInStrings", `'a;''b' "c;""d" ` + "`e;``f`" + ` [g;h] x';'`,
			[]sqllex.Token{tok(o, `'a;''b'`), tok(sp, " "), tok(o, `"c;""d"`), tok(sp, " "), tok(o, "`e;``f`"), tok(sp, " "),
				tok(o, "[g;h]"), tok(sp, " "), tok(o, "x';'")}},
		{"Comments", "-- a;\n/* b; */", []sqllex.Token{tok(sp, "-- a;"), tok(sp, "\n"), tok(sp, "/* b; */")}},
		{"OpenCommentRunsToTheEnd", "1 /* a; b", []sqllex.Token{tok(o, "1"), tok(sp, " "), {Kind: sp, Text: "/* a; b", Open: true}}},
		{"NamedParameters", ":a @b $c :a$b $t::u(v)",
			[]sqllex.Token{tok(v, ":a"), tok(sp, " "), tok(v, "@b"), tok(sp, " "), tok(v, "$c"), tok(sp, " "), tok(v, ":a$b"), tok(sp, " "), tok(v, "$t::u(v)")}},
		{"PostgresCast", "x::text", []sqllex.Token{tok(w, "x"), tok(o, "::"), tok(w, "text")}},
		{"DigitName", ":1", []sqllex.Token{tok(v, ":1")}},
		{"ColonAlone", ": 2", []sqllex.Token{tok(o, ":"), tok(sp, " "), tok(o, "2")}},
		{"Positional", "? ?12", []sqllex.Token{tok(pos, "?"), tok(sp, " "), tok(pos, "?12")}},
		{"WordsAndUTF8", "café a$b_1", []sqllex.Token{tok(w, "café"), tok(sp, " "), tok(w, "a$b_1")}},
		{"ParenthesesOneEach", "(()", []sqllex.Token{tok(o, "("), tok(o, "("), tok(o, ")")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := tokens(c.src)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("tokens(%q) =\n%+v\nwant\n%+v", c.src, got, c.want)
			}
		})
	}
	for _, c := range []struct{ src, err string }{
		{"'a", "unterminated '...'"},
		{`"a`, `unterminated "..."`},
		{"`a", "unterminated `...`"},
		{"[a", "unterminated [identifier]"},
		{"x'41", "unterminated '...'"},
	} {
		_, err := sqllex.Next(c.src)
		if err == nil || err.Error() != c.err || !errors.Is(err, sqllex.ErrUnterminated) {
			t.Errorf("Next(%q): %v, want %q wrapping ErrUnterminated", c.src, err, c.err)
		}
	}
}
