package sqlproc

import (
	"reflect"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, c := range []struct {
		name string
		src  string
		want []string
	}{
		{"One", "SELECT 1", []string{"SELECT 1"}},
		{"OneWithSemicolon", "  SELECT 1;  \n", []string{"SELECT 1"}},
		{"Two", "SELECT 1; SELECT 2;", []string{"SELECT 1", "SELECT 2"}},
		{"EmptyStatementsDropped", ";; SELECT 1;;; ;", []string{"SELECT 1"}},
		{"CommentsOnly", "-- nothing\n/* here */", nil},
		{"LeadingCommentNotInText", "-- why\nSELECT 1; /* next */ SELECT 2", []string{"SELECT 1", "SELECT 2"}},
		{"InnerCommentKept", "SELECT /* ; */ 1 -- ;\n, 2", []string{"SELECT /* ; */ 1 -- ;\n, 2"}},
		{"SemicolonInString", "SELECT 'a;b''c;'; SELECT 2", []string{"SELECT 'a;b''c;'", "SELECT 2"}},
		{"SemicolonInQuotedIdentifiers", `SELECT "a;""b", [c;d], ` + "`e;``f`" + `; SELECT 2`,
			[]string{`SELECT "a;""b", [c;d], ` + "`e;``f`", "SELECT 2"}},
		{"SemicolonInBlob", "SELECT x';'; SELECT 2", []string{"SELECT x';'", "SELECT 2"}},
		{"Trigger", "CREATE TRIGGER t AFTER INSERT ON a BEGIN INSERT INTO b VALUES (1); UPDATE c SET n = n + 1; END; SELECT 1",
			[]string{"CREATE TRIGGER t AFTER INSERT ON a BEGIN INSERT INTO b VALUES (1); UPDATE c SET n = n + 1; END", "SELECT 1"}},
		{"TriggerLowerCaseTemp", "create temp trigger t after insert on a begin delete from b; end;select 1",
			[]string{"create temp trigger t after insert on a begin delete from b; end", "select 1"}},
		{"TriggerTemporaryIfNotExists", "CREATE TEMPORARY TRIGGER IF NOT EXISTS t BEFORE DELETE ON a BEGIN SELECT 1; END",
			[]string{"CREATE TEMPORARY TRIGGER IF NOT EXISTS t BEFORE DELETE ON a BEGIN SELECT 1; END"}},
		{"TriggerWithCaseEnd", "CREATE TRIGGER t AFTER INSERT ON a BEGIN UPDATE b SET x = CASE WHEN new.v THEN 1 ELSE 2 END; END; SELECT 2",
			[]string{"CREATE TRIGGER t AFTER INSERT ON a BEGIN UPDATE b SET x = CASE WHEN new.v THEN 1 ELSE 2 END; END", "SELECT 2"}},
		{"TriggerEndCommentSemicolon", "CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END /* c */ ; SELECT 2",
			[]string{"CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END", "SELECT 2"}},
		{"TriggerStringWithEnd", "CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT '; END;'; END; SELECT 2",
			[]string{"CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT '; END;'; END", "SELECT 2"}},
		{"CreateTableNamedTrigger", `CREATE TABLE "trigger" (x); SELECT 1`, []string{`CREATE TABLE "trigger" (x)`, "SELECT 1"}},
		{"ExplainQueryPlanCreateTrigger", "EXPLAIN QUERY PLAN CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END; SELECT 2",
			[]string{"EXPLAIN QUERY PLAN CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END", "SELECT 2"}},
		{"TriggerWithoutFinalSemicolon", "CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END",
			[]string{"CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END"}},
		{"CommentAtEnd", "SELECT 1 -- done", []string{"SELECT 1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := split(c.src)
			if err != nil {
				t.Fatalf("split(%q): %v", c.src, err)
			}
			var texts []string
			for _, s := range got {
				texts = append(texts, s.text)
			}
			if !reflect.DeepEqual(texts, c.want) {
				t.Fatalf("split(%q) =\n%q\nwant\n%q", c.src, texts, c.want)
			}
		})
	}

	for _, c := range []struct{ name, src, err string }{
		{"ErrString", "SELECT 'a; SELECT 2", "at byte 7: unterminated '...'"},
		{"ErrIdentifier", `SELECT "a`, `at byte 7: unterminated "..."`},
		{"ErrBracket", "SELECT [a", "at byte 7: unterminated [identifier]"},
		{"ErrComment", "SELECT 1 /* a", "at byte 9: unterminated comment"},
		{"ErrBlob", "SELECT x'41", "at byte 7: unterminated '...'"},
		{"ErrTrigger", "CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1;", "CREATE TRIGGER without its END"},
		{"ErrTriggerNoSemicolon", "CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1", "CREATE TRIGGER without its END"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := split(c.src)
			if err == nil || err.Error() != c.err {
				t.Fatalf("split(%q) = %v, %v; want error %q", c.src, got, err, c.err)
			}
		})
	}
}

func TestSplit_Params(t *testing.T) {
	for _, c := range []struct {
		name, src   string
		params      []string
		refused     string
		positional_ string
	}{
		{"Named", "SELECT :a, @b, $c, :a", []string{"a", "b", "c"}, "", "SELECT ?1, ?2, ?3, ?1"},
		{"NotInStringsOrComments", "SELECT ':x', \":y\", [:z] -- :w\n, /* :v */ :u", []string{"u"}, "",
			"SELECT ':x', \":y\", [:z] -- :w\n, /* :v */ ?1"},
		{"Adjacent", "SELECT :a||:b", []string{"a", "b"}, "", "SELECT ?1||?2"},
		{"DollarSign", "SELECT :a$b", []string{"a$b"}, "", "SELECT ?1"},
		{"TclStyle", "SELECT $a::b(c)", []string{"a::b(c)"}, "", "SELECT ?1"},
		{"UTF8Name", "SELECT :café", []string{"café"}, "", "SELECT ?1"},
		{"ColonAlone", "SELECT 1 : 2", nil, "", "SELECT 1 : 2"},
		{"Positional", "SELECT ?", nil, "?", "SELECT ?"},
		{"PositionalNumbered", "SELECT :a, ?12", []string{"a"}, "?12", "SELECT ?1, ?12"},
		{"Rollback", "INSERT OR ROLLBACK INTO t VALUES (:x)", []string{"x"}, "ROLLBACK", "INSERT OR ROLLBACK INTO t VALUES (?1)"},
		{"RaiseRollbackLowerCase", "select raise(rollback, 'no')", nil, "rollback", "select raise(rollback, 'no')"},
		{"QuotedRollbackIsAName", `SELECT "rollback" FROM t`, nil, "", `SELECT "rollback" FROM t`},
		{"FirstKeywordWith", "WITH x AS (SELECT 1) SELECT * FROM x", nil, "", "WITH x AS (SELECT 1) SELECT * FROM x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			stmts, err := split(c.src)
			if err != nil || len(stmts) != 1 {
				t.Fatalf("split(%q) = %v, %v; want one statement", c.src, stmts, err)
			}
			s := stmts[0]
			if !reflect.DeepEqual(s.params, c.params) {
				t.Errorf("params = %q, want %q", s.params, c.params)
			}
			if s.refused != c.refused {
				t.Errorf("refused = %q, want %q", s.refused, c.refused)
			}
			if got := s.positional(); got != c.positional_ {
				t.Errorf("positional() = %q, want %q", got, c.positional_)
			}
		})
	}
}

// FuzzSplit: split never panics; every statement is a piece of the input,
// whole (it splits again into itself), with its parameters where it says.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{
		"SELECT 1; SELECT 'a;b'",
		"CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END; SELECT :x",
		"SELECT \"a\"\"b\", [c], `d`, x'00' -- e\n/* f */",
		"SELECT $a::b(c), @d, ?1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		stmts, err := split(src)
		if err != nil {
			return
		}
		for _, s := range stmts {
			if s.text == "" || !strings.Contains(src, s.text) {
				t.Fatalf("split(%q): statement %q is not a piece of the input", src, s.text)
			}
			again, err := split(s.text)
			if err != nil || len(again) != 1 || again[0].text != s.text {
				t.Fatalf("split(%q): statement %q splits again into %v, %v", src, s.text, again, err)
			}
			for _, u := range s.uses {
				if got := s.text[u.at+1 : u.end]; got != s.params[u.index] {
					t.Fatalf("split(%q): parameter at %d is %q, recorded as %q", src, u.at, got, s.params[u.index])
				}
			}
		}
	})
}
