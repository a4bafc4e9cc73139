package sqlproc

import (
	"reflect"
	"testing"
)

func TestCSVDecoder(t *testing.T) {
	two := Config{Input: InputCSV, Columns: []string{"a", "b"}}
	trim := two
	trim.Trim = true
	none := two
	none.Quoting = QuotingNone
	noneTrim := none
	noneTrim.Trim = true
	tab := two
	tab.Delimiter = `\t`
	semi := two
	semi.Delimiter = ";"
	text := two
	text.Text = []string{"a"}

	for _, c := range []struct {
		name string
		cfg  Config
		line string
		want []any
	}{
		{"Integers", two, "5,-7", []any{int64(5), int64(-7)}},
		{"PlusAndLeadingZeros", two, "+5,007", []any{int64(5), int64(7)}},
		{"Extremes", two, "9223372036854775807,-9223372036854775808", []any{int64(9223372036854775807), int64(-9223372036854775808)}},
		{"OverflowIsText", two, "9223372036854775808,1", []any{"9223372036854775808", int64(1)}},
		{"DecimalIsText", two, "1.5,1e3", []any{"1.5", "1e3"}},
		{"SpacesKeptWithoutTrim", two, " 5 , a ", []any{" 5 ", " a "}},
		{"Empty", two, ",", []any{"", ""}},
		{"Quoted", two, `"a,b","say ""hi"""`, []any{"a,b", `say "hi"`}},
		{"QuotedNumberIsText", two, `"12",12`, []any{"12", int64(12)}},
		{"QuotedEmpty", two, `"",x`, []any{"", "x"}},
		{"QuotedLineBreak", two, "\"a\nb\",c", []any{"a\nb", "c"}},
		{"NotUTF8IsBlob", two, "\xff\xfe,a", []any{[]byte("\xff\xfe"), "a"}},
		{"Trim", trim, " \t 5\u00a0, a b\u3000", []any{int64(5), "a b"}},
		{"TrimAroundQuotes", trim, `  "x " , "y"  `, []any{"x ", "y"}},
		{"NoQuoting", none, `"a",say "hi"`, []any{`"a"`, `say "hi"`}},
		{"NoQuotingTrim", noneTrim, ` "a" , 5 `, []any{`"a"`, int64(5)}},
		{"Tab", tab, "a,b\t1", []any{"a,b", int64(1)}},
		{"Semicolon", semi, "a;1", []any{"a", int64(1)}},
		{"TextColumn", text, "007,007", []any{"007", int64(7)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := make([]any, 2)
			if err := newDecoder(c.cfg).decode([]byte(c.line), dst); err != nil {
				t.Fatalf("decode(%q): %v", c.line, err)
			}
			if !reflect.DeepEqual(dst, c.want) {
				t.Fatalf("decode(%q) = %#v, want %#v", c.line, dst, c.want)
			}
		})
	}

	for _, c := range []struct {
		name string
		cfg  Config
		line string
		err  string
	}{
		{"ErrOneField", two, "5", "1 fields, want 2"},
		{"ErrEmptyLine", two, "", "1 fields, want 2"},
		{"ErrThreeFields", two, "1,2,3", "3 fields, want 2"},
		{"ErrThreeFieldsNoQuoting", none, `"a",b,c`, "3 fields, want 2"},
		{"ErrUnterminatedQuote", two, `"a,b`, "field 1: a quoted field without its closing quote"},
		{"ErrBareQuote", two, `a"b,c`, "field 1: a quote in an unquoted field"},
		{"ErrTextAfterQuote", two, `x,"a"b`, "field 2: text after a quoted field's closing quote"},
		{"ErrSpaceAfterQuoteWithoutTrim", two, `"a" ,b`, "field 1: text after a quoted field's closing quote"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := newDecoder(c.cfg).decode([]byte(c.line), make([]any, 2))
			if err == nil || err.Error() != c.err {
				t.Fatalf("decode(%q) error = %v, want %q", c.line, err, c.err)
			}
		})
	}
}

func TestJSONDecoder(t *testing.T) {
	cfg := Config{Input: InputJSON, Fields: map[string]string{
		"a": "$.a", "b": "b.c", "c": `$["odd key"][1]`, "d": "$.d", "e": "$",
	}, Required: []string{"a"}}
	// Fields bind in name order: a, b, c, d, e.
	for _, c := range []struct {
		name, doc string
		want      []any
	}{
		{"Types", `{"a":"x","b":{"c":12},"odd key":[0,1.5],"d":true}`,
			[]any{"x", int64(12), 1.5, int64(1), `{"a":"x","b":{"c":12},"odd key":[0,1.5],"d":true}`}},
		{"ObjectsAsCompactJSON", `{"a": [1, {"b" : 2}], "b": {"c": {"z": 1, "y": [ ]}}}`,
			[]any{`[1,{"b":2}]`, `{"z":1,"y":[]}`, nil, nil, `{"a":[1,{"b":2}],"b":{"c":{"z":1,"y":[]}}}`}},
		{"NullIsPresent", `{"a":null,"d":false}`, []any{nil, nil, nil, int64(0), `{"a":null,"d":false}`}},
		{"BigIntegerIsReal", `{"a":18446744073709551616,"d":-1e2}`, []any{1.8446744073709552e19, nil, nil, -100.0, `{"a":18446744073709551616,"d":-1e2}`}},
		{"BeyondFloatIsText", `{"a":1e400}`, []any{"1e400", nil, nil, nil, `{"a":1e400}`}},
		{"Escapes", `{"a":"\u00e9\n\"<"}`, []any{"é\n\"<", nil, nil, nil, `{"a":"\u00e9\n\"<"}`}},
		{"WrongShapeIsMissing", `{"a":1,"b":[1],"odd key":{"1":2}}`, []any{int64(1), nil, nil, nil, `{"a":1,"b":[1],"odd key":{"1":2}}`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := make([]any, 5)
			if err := newDecoder(cfg).decode([]byte(c.doc), dst); err != nil {
				t.Fatalf("decode(%s): %v", c.doc, err)
			}
			if !reflect.DeepEqual(dst, c.want) {
				t.Fatalf("decode(%s) = %#v, want %#v", c.doc, dst, c.want)
			}
		})
	}
	for _, c := range []struct{ name, doc, err string }{
		{"ErrNotJSON", `{"a":1`, "not a JSON document"},
		{"ErrTrailing", `{"a":1} x`, "not a JSON document"},
		{"ErrEmpty", ``, "not a JSON document"},
		{"ErrMissingRequired", `{"b":{"c":1}}`, "no field a ($.a)"},
		{"ErrNotAnObject", `[1,2]`, "no field a ($.a)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := newDecoder(cfg).decode([]byte(c.doc), make([]any, 5))
			if err == nil || err.Error() != c.err {
				t.Fatalf("decode(%s) error = %v, want %q", c.doc, err, c.err)
			}
		})
	}
}

func TestParsePath(t *testing.T) {
	for _, c := range []struct {
		path, canonical string
	}{
		{"$", "$"},
		{"a", "$.a"},
		{"a.b", "$.a.b"},
		{"$.a.b", "$.a.b"},
		{"$.a[0][12]", "$.a[0][12]"},
		{"[3].x", "$[3].x"},
		{`$["a.b"]["c"]`, `$["a.b"].c`},
		{`$["say \"hi\""]`, `$["say \"hi\""]`},
	} {
		steps, err := parsePath(c.path)
		if err != nil {
			t.Errorf("parsePath(%q): %v", c.path, err)
			continue
		}
		if got := formatPath(steps); got != c.canonical {
			t.Errorf("parsePath(%q) = %s, want %s", c.path, got, c.canonical)
		}
	}
	for _, p := range []string{"$.", "$..a", "a..b", "$[", "$[x]", "$[1", `$["a"`, `$["a"x]`, "$x", "$[-1]", "$[12345678901]"} {
		if steps, err := parsePath(p); err == nil {
			t.Errorf("parsePath(%q) = %v, want an error", p, formatPath(steps))
		}
	}
}
