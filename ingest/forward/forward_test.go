package forward_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/forward"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestField(t *testing.T) {
	for _, c := range []struct {
		name, line string
		n          int
		want       string
	}{
		{"OKFirst", "a,b,c", 1, "a"},
		{"OKMiddle", "a,b,c", 2, "b"},
		{"OKLast", "a,b,c", 3, "c"},
		{"OKOnlyField", "abc", 1, "abc"},
		{"OKQuotedWithCommas", `"a,b",c`, 1, "a,b"},
		{"OKAfterQuotedWithCommas", `"a,b",c`, 2, "c"},
		{"OKQuotedLast", `a,"b,c"`, 2, "b,c"},
		{"OKDoubledQuotes", `x,"say ""hi""",y`, 2, `say "hi"`},
		{"OKAfterDoubledQuotes", `x,"say ""hi""",y`, 3, "y"},
		{"OKOnlyADoubledQuote", `""""`, 1, `"`},
		{"OKEmptyLine", "", 1, ""},
		{"OKEmptyFirst", ",b", 1, ""},
		{"OKEmptyMiddle", "a,,c", 2, ""},
		{"OKEmptyLast", "a,", 2, ""},
		{"OKAllEmpty", ",,", 3, ""},
		{"OKEmptyQuoted", `"",b`, 1, ""},
		{"OKAfterEmptyQuoted", `"",b`, 2, "b"},
		{"OKSpacesKept", " a , b ", 2, " b "},
		// A quote that does not open the field is text, and a field after
		// the one asked for is not looked at.
		{"OKBareQuoteInside", `a"b,c`, 1, `a"b`},
		{"OKSpaceBeforeQuote", ` "a",b`, 1, ` "a"`},
		{"OKLaterFieldMalformed", `a,"b`, 1, "a"},
		{"OKBinary", "\x00\xff,\xfe", 2, "\xfe"},
		{"OKQuotedNewline", "\"a\nb\",c", 1, "a\nb"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := forward.Field([]byte(c.line), c.n)
			if err != nil {
				t.Fatalf("Field(%q, %d): %v", c.line, c.n, err)
			}
			if string(got) != c.want {
				t.Fatalf("Field(%q, %d) = %q, want %q", c.line, c.n, got, c.want)
			}
		})
	}

	const fewer = "the line has fewer fields than the key field"
	for _, c := range []struct {
		name, line string
		n          int
		err        string
	}{
		{"ErrBeyondCount", "a,b", 3, fewer},
		{"ErrBeyondEmptyLine", "", 2, fewer},
		{"ErrBeyondQuoted", `"a,b"`, 2, fewer},
		{"ErrZero", "a,b", 0, fewer},
		{"ErrNegative", "a,b", -1, fewer},
		{"ErrUnterminated", `"abc`, 1, "unterminated quoted field"},
		{"ErrUnterminatedOnlyQuote", `"`, 1, "unterminated quoted field"},
		{"ErrUnterminatedDoubledAtEnd", `"abc""`, 1, "unterminated quoted field"},
		{"ErrUnterminatedLater", `a,"b`, 2, "unterminated quoted field"},
		{"ErrUnterminatedSwallowsRest", `"a,b`, 2, "unterminated quoted field"},
		{"ErrTextAfterQuote", `"a"b,c`, 1, "text after a closing quote"},
		{"ErrSpaceAfterQuote", `"a" ,b`, 1, "text after a closing quote"},
		{"ErrTextAfterQuoteEarlier", `"a"b,c`, 2, "text after a closing quote"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := forward.Field([]byte(c.line), c.n)
			if err == nil {
				t.Fatalf("Field(%q, %d) = %q, no error", c.line, c.n, got)
			}
			if err.Error() != c.err {
				t.Fatalf("Field(%q, %d) error = %q, want %q", c.line, c.n, err, c.err)
			}
			if got != nil {
				t.Fatalf("Field(%q, %d) = %q with an error", c.line, c.n, got)
			}
		})
	}
}

// FuzzField: Field never panics; a field it returns is no longer than the
// line, every field before it parses too, and where encoding/csv reads the
// line as one strict RFC 4180 record, Field agrees with it.
func FuzzField(f *testing.F) {
	for _, s := range []string{"a,b,c", `"a,b",c`, `x,"say ""hi""",y`, ",,", `"",b`, `"abc`, `"a"b,c`, `a"b,c`, "\x00\xff,\"\xfe\""} {
		for n := range 4 {
			f.Add([]byte(s), n)
		}
	}
	f.Fuzz(func(t *testing.T, line []byte, n int) {
		got, err := forward.Field(line, n)
		if err != nil {
			if got != nil {
				t.Fatalf("Field(%q, %d) = %q with error %v", line, n, got, err)
			}
			return
		}
		if len(got) > len(line) {
			t.Fatalf("Field(%q, %d) = %q, longer than the line", line, n, got)
		}
		for k := 1; k < n; k++ {
			if _, err := forward.Field(line, k); err != nil {
				t.Fatalf("Field(%q, %d) succeeded but field %d fails: %v", line, n, k, err)
			}
		}
		if rec, ok := csvRecord(line); ok {
			if n < 1 || n > len(rec) {
				t.Fatalf("Field(%q, %d) = %q, but encoding/csv reads %d fields", line, n, got, len(rec))
			}
			if string(got) != rec[n-1] {
				t.Fatalf("Field(%q, %d) = %q, encoding/csv reads %q", line, n, got, rec[n-1])
			}
		}
	})
}

// csvRecord reads line as one strict CSV record. Lines with "\r" or "\n",
// and empty lines, are left out: encoding/csv treats them as record breaks.
func csvRecord(line []byte) ([]string, bool) {
	if len(line) == 0 || bytes.ContainsAny(line, "\r\n") {
		return nil, false
	}
	r := csv.NewReader(bytes.NewReader(line))
	rec, err := r.Read()
	if err != nil {
		return nil, false
	}
	if _, err := r.Read(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return rec, true
}

// must is testutil.Must.
var must = testutil.Must

// applyAll runs each item through p, one item each at positions 1, 2, ...,
// in one committed transaction; it returns Apply's errors (the failed
// items rolled back).
func applyAll(t *testing.T, s *outbox.Store, p *forward.Processor, items ...ingest.Item) []error {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	must(t, err)
	defer tx.Rollback()
	var errs []error
	for i, it := range items {
		d := ingest.Delivery{Feed: "f", Partition: 1, Epoch: "e", Position: int64(i + 1), Sequence: int64(i + 1), Attempt: 1}
		must(t, tx.BeginItem(d.Place()))
		err := p.Apply(ctx, tx, d, it)
		errs = append(errs, err)
		if err != nil {
			must(t, tx.RollbackItem())
			continue
		}
		must(t, tx.EndItem())
	}
	must(t, tx.Commit())
	return errs
}

func allRows(t *testing.T, s *outbox.Store) []outbox.Row {
	t.Helper()
	rows, err := s.Rows(context.Background(), 0, 1000)
	must(t, err)
	return rows
}

func TestProcessor_Apply(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		value := []byte("x,\"q,1\",\xff\x00 tail ")
		errs := applyAll(t, s, forward.New("fwd", 0), ingest.Item{Value: value})
		must(t, errs[0])
		rows := allRows(t, s)
		if len(rows) != 1 {
			t.Fatalf("rows = %+v", rows)
		}
		r := rows[0]
		if r.Topic != "fwd" || !bytes.Equal(r.Value, value) || r.Key != nil || r.Headers != nil {
			t.Fatalf("row = %+v, want topic fwd, the value unchanged, no key, no headers", r)
		}
		if r.Feed != "f" || r.Partition != 1 || r.Epoch != "e" || r.Position != 1 || r.N != 0 {
			t.Fatalf("row place = %s[%d] %s@%d n=%d", r.Feed, r.Partition, r.Epoch, r.Position, r.N)
		}
		var typ string
		must(t, outboxtest.Get(context.Background(), s, &typ, `SELECT CASE WHEN key IS NULL THEN 'null' WHEN length(key) = 0 THEN 'empty' ELSE 'bytes' END FROM outbox`))
		if typ != "null" {
			t.Fatalf("key stored as %s, want null", typ)
		}
	})

	t.Run("ItemKeyKeptWithoutKeyField", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		must(t, applyAll(t, s, forward.New("fwd", 0), ingest.Item{Key: []byte("k1"), Value: []byte("a,b")})[0])
		if r := allRows(t, s)[0]; string(r.Key) != "k1" || string(r.Value) != "a,b" {
			t.Fatalf("row key %q value %q, want k1, a,b", r.Key, r.Value)
		}
	})

	t.Run("KeyField", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		items := []ingest.Item{
			{Value: []byte(`x,"k,1",y`)},
			{Value: []byte(`x,"say ""hi""",y`)},
			{Key: []byte("item key"), Value: []byte("x,field key")}, // the field wins
		}
		for _, err := range applyAll(t, s, forward.New("fwd", 2), items...) {
			must(t, err)
		}
		rows := allRows(t, s)
		want := []struct{ key, value string }{{"k,1", `x,"k,1",y`}, {`say "hi"`, `x,"say ""hi""",y`}, {"field key", "x,field key"}}
		if len(rows) != len(want) {
			t.Fatalf("%d rows, want %d", len(rows), len(want))
		}
		for i, w := range want {
			if string(rows[i].Key) != w.key || string(rows[i].Value) != w.value {
				t.Fatalf("row %d: key %q value %q, want %q %q", i, rows[i].Key, rows[i].Value, w.key, w.value)
			}
		}
	})

	t.Run("HeadersPassedThrough", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		hs := []outbox.Header{{Key: "trace", Value: []byte{0, 1, 0xff}}, {Key: "trace", Value: []byte("again")}, {Key: "", Value: []byte("x")}}
		must(t, applyAll(t, s, forward.New("fwd", 1), ingest.Item{Value: []byte("k,v"), Headers: hs})[0])
		r := allRows(t, s)[0]
		got, err := outbox.DecodeHeaders(r.Headers)
		must(t, err)
		if len(got) != len(hs) {
			t.Fatalf("headers = %+v, want %+v", got, hs)
		}
		for i := range hs {
			if got[i].Key != hs[i].Key || !bytes.Equal(got[i].Value, hs[i].Value) {
				t.Fatalf("header %d = %+v, want %+v", i, got[i], hs[i])
			}
		}
		if string(r.Key) != "k" {
			t.Fatalf("key = %q, want k", r.Key)
		}
	})

	// An empty key field is an empty key whether it is written `` or `""`:
	// the relay publishes a nil key as a null key (spread over partitions)
	// and an empty one as a key (hashed to one partition), so the two
	// spellings of the same CSV value must not be told apart.
	t.Run("EmptyKeyFieldSameQuotedOrNot", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		errs := applyAll(t, s, forward.New("fwd", 1), ingest.Item{Value: []byte(",v")}, ingest.Item{Value: []byte(`"",v`)})
		must(t, errs[0])
		must(t, errs[1])
		var types []string
		must(t, outboxtest.Select(context.Background(), s, &types, `SELECT CASE WHEN key IS NULL THEN 'null' WHEN length(key) = 0 THEN 'empty' ELSE 'bytes' END FROM outbox ORDER BY id`))
		if len(types) != 2 || types[0] != types[1] {
			t.Fatalf("key of `,v` stored as %s, key of `\"\",v` as %s", types[0], types[1])
		}
	})

	t.Run("ErrMalformed", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		items := []ingest.Item{
			{Value: []byte(`"abc,d`)},
			{Value: []byte(`"a"b,c`)},
			{Value: []byte("a")},
			{Value: nil},
		}
		errs := applyAll(t, s, forward.New("fwd", 2), items...)
		for i, err := range errs {
			pe, ok := ingest.IsPermanent(err)
			if !ok {
				t.Fatalf("Apply(%q) = %v, want a permanent error", items[i].Value, err)
			}
			if pe.Reason != ingest.ReasonMalformed {
				t.Fatalf("Apply(%q) reason = %q, want %q", items[i].Value, pe.Reason, ingest.ReasonMalformed)
			}
		}
		for i, want := range []string{
			"malformed: unterminated quoted field",
			"malformed: text after a closing quote",
			"malformed: the line has fewer fields than the key field",
			"malformed: the line has fewer fields than the key field",
		} {
			if errs[i].Error() != want {
				t.Fatalf("Apply(%q) error = %q, want %q", items[i].Value, errs[i], want)
			}
		}
		if rows := allRows(t, s); len(rows) != 0 {
			t.Fatalf("malformed items emitted %+v", rows)
		}
	})

	t.Run("ErrNoTopic", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		err := applyAll(t, s, forward.New("", 0), ingest.Item{Value: []byte("v")})[0]
		if err == nil || !strings.Contains(err.Error(), "no topic") {
			t.Fatalf("Apply with no topic = %v", err)
		}
		if _, ok := ingest.IsPermanent(err); ok {
			t.Fatalf("a missing topic is not the item's fault, yet %v is permanent", err)
		}
	})
}
