package ledger_test

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name, line string
		want       ledger.Entry
	}{
		{"OK", "a,5", ledger.Entry{Account: "a", Amount: 5}},
		{"OKSpaces", " a , -5 ", ledger.Entry{Account: "a", Amount: -5}},
		{"OKTabsAndCR", "\ta\t,\t7\r", ledger.Entry{Account: "a", Amount: 7}},
		{"OKPlus", "a,+7", ledger.Entry{Account: "a", Amount: 7}},
		{"OKZero", "a,0", ledger.Entry{Account: "a", Amount: 0}},
		{"OKMinusZero", "a,-0", ledger.Entry{Account: "a", Amount: 0}},
		{"OKLeadingZeros", "a,007", ledger.Entry{Account: "a", Amount: 7}},
		{"OKMax", "a,9223372036854775807", ledger.Entry{Account: "a", Amount: math.MaxInt64}},
		{"OKMin", "a,-9223372036854775808", ledger.Entry{Account: "a", Amount: math.MinInt64}},
		{"OKAccountWithSpaces", "my savings account,12", ledger.Entry{Account: "my savings account", Amount: 12}},
		{"OKUnicodeAccount", "  café ☕ Ωmega ,3", ledger.Entry{Account: "café ☕ Ωmega", Amount: 3}},
		{"OKUnicodeSpaceTrimmed", "\u00a0a\u2003,\u30001", ledger.Entry{Account: "a", Amount: 1}},
		{"OKQuotesAreAccountText", `"a",1`, ledger.Entry{Account: `"a"`, Amount: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ledger.Parse([]byte(c.line))
			if err != nil {
				t.Fatalf("Parse(%q): %v", c.line, err)
			}
			if got != c.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", c.line, got, c.want)
			}
		})
	}

	for _, c := range []struct {
		name, line, err string
	}{
		{"ErrEmptyLine", "", "no comma: want account,amount"},
		{"ErrNoComma", "a 5", "no comma: want account,amount"},
		{"ErrSemicolon", "a;5", "no comma: want account,amount"},
		{"ErrEmptyAccount", ",5", "empty account"},
		{"ErrSpacesOnlyAccount", "   ,5", "empty account"},
		{"ErrOnlyComma", ",", "empty account"},
		{"ErrMissingAmount", "a,", "missing amount"},
		{"ErrSpacesOnlyAmount", "a,   ", "missing amount"},
		{"ErrLetterSuffix", "a,12z", `amount "12z" is not a 64-bit integer`},
		{"ErrDecimal", "a,1.5", `amount "1.5" is not a 64-bit integer`},
		{"ErrHex", "a,0x10", `amount "0x10" is not a 64-bit integer`},
		{"ErrUnderscore", "a,1_000", `amount "1_000" is not a 64-bit integer`},
		{"ErrExponent", "a,1e3", `amount "1e3" is not a 64-bit integer`},
		{"ErrInnerSpace", "a,1 000", `amount "1 000" is not a 64-bit integer`},
		{"ErrDoubleSign", "a,+-1", `amount "+-1" is not a 64-bit integer`},
		{"ErrSignOnly", "a,-", `amount "-" is not a 64-bit integer`},
		{"ErrOverflow", "a,9223372036854775808", `amount "9223372036854775808" is not a 64-bit integer`},
		{"ErrUnderflow", "a,-9223372036854775809", `amount "-9223372036854775809" is not a 64-bit integer`},
		// The line is cut at its first comma: the rest is the amount.
		{"ErrExtraField", "a,1,2", `amount "1,2" is not a 64-bit integer`},
		{"ErrTrailingComma", "a,1,", `amount "1," is not a 64-bit integer`},
		{"ErrFullwidthDigits", "a,１２", `amount "１２" is not a 64-bit integer`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ledger.Parse([]byte(c.line))
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, no error", c.line, got)
			}
			if err.Error() != c.err {
				t.Fatalf("Parse(%q) error = %q, want %q", c.line, err, c.err)
			}
			if got != (ledger.Entry{}) {
				t.Fatalf("Parse(%q) = %+v with an error", c.line, got)
			}
		})
	}
}

// FuzzParse: Parse never panics, and an entry it accepts, written back as
// "account,amount", parses to the same entry. The seed corpus in
// testdata/fuzz/FuzzParse holds the malformed lines of TestParse.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := ledger.Parse(line)
		if err != nil {
			if e != (ledger.Entry{}) {
				t.Fatalf("Parse(%q) = %+v with error %v", line, e, err)
			}
			return
		}
		if e.Account == "" {
			t.Fatalf("Parse(%q) accepted an empty account", line)
		}
		again, err := ledger.Parse([]byte(e.Account + "," + strconv.FormatInt(e.Amount, 10)))
		if err != nil {
			t.Fatalf("Parse(%q) = %+v, whose re-formatting does not parse: %v", line, e, err)
		}
		if again != e {
			t.Fatalf("Parse(%q) = %+v, re-formatted parses as %+v", line, e, again)
		}
	})
}

// must is testutil.Must.
var must = testutil.Must

func delivery(pos int64) ingest.Delivery {
	return ingest.Delivery{Feed: "f", Epoch: "e", Position: pos, Sequence: 1, Attempt: 1}
}

// apply runs one line through p in its own item of tx, keeping the item's
// writes when Apply succeeds and rolling them back when it fails, as the
// ingest loop does.
func apply(t *testing.T, tx *outbox.Tx, p *ledger.Processor, d ingest.Delivery, line string) error {
	t.Helper()
	must(t, tx.BeginItem(d.Place()))
	if err := p.Apply(context.Background(), tx, d, ingest.Item{Value: []byte(line)}); err != nil {
		must(t, tx.RollbackItem())
		return err
	}
	must(t, tx.EndItem())
	return nil
}

func balances(t *testing.T, s *outbox.Store, feed string) map[string]int64 {
	t.Helper()
	m, err := ledger.Balances(context.Background(), s, feed)
	must(t, err)
	return m
}

type row struct {
	Topic, Key, Value string
	Position          int64
	N                 int
}

func rows(t *testing.T, s *outbox.Store) []row {
	t.Helper()
	rs, err := s.Rows(context.Background(), 0, 1000)
	must(t, err)
	var out []row
	for _, r := range rs {
		out = append(out, row{r.Topic, string(r.Key), string(r.Value), r.Position, r.N})
		if r.Headers != nil {
			t.Fatalf("ledger output with headers %x", r.Headers)
		}
	}
	return out
}

func sameRows(t *testing.T, got, want []row) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("rows:\n got %+v\nwant %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("row %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

func TestProcessor_Apply(t *testing.T) {
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("ledger-out")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(10), "a,5"))
		must(t, apply(t, tx, p, delivery(20), " b , -3 "))
		must(t, apply(t, tx, p, delivery(30), "a,+7"))
		must(t, tx.Commit())

		if got, want := balances(t, s, "f"), map[string]int64{"a": 12, "b": -3}; !maps.Equal(got, want) {
			t.Fatalf("balances = %v, want %v", got, want)
		}
		if got := balances(t, s, "other"); len(got) != 0 {
			t.Fatalf("balances of another feed = %v", got)
		}
		sameRows(t, rows(t, s), []row{
			{"ledger-out", "a", `{"account":"a","amount":5,"balance":5,"feed":"f","epoch":"e","position":10}`, 10, 0},
			{"ledger-out", "b", `{"account":"b","amount":-3,"balance":-3,"feed":"f","epoch":"e","position":20}`, 20, 0},
			{"ledger-out", "a", `{"account":"a","amount":7,"balance":12,"feed":"f","epoch":"e","position":30}`, 30, 0},
		})
		var lines int
		must(t, outboxtest.Get(context.Background(), s, &lines, `SELECT lines FROM ledger_balances WHERE feed = 'f' AND account = 'a'`))
		if lines != 2 {
			t.Fatalf("lines of a = %d, want 2", lines)
		}
	})

	t.Run("BalancesPerFeed", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(1), "a,5"))
		g := ingest.Delivery{Feed: "g", Epoch: "x", Position: 1}
		must(t, apply(t, tx, p, g, "a,100"))
		must(t, tx.Commit())
		if got := balances(t, s, "f"); !maps.Equal(got, map[string]int64{"a": 5}) {
			t.Fatalf("balances of f = %v", got)
		}
		if got := balances(t, s, "g"); !maps.Equal(got, map[string]int64{"a": 100}) {
			t.Fatalf("balances of g = %v", got)
		}
	})

	t.Run("JSONEscaping", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(4), `<x> "q" & é,1`))
		must(t, tx.Commit())
		sameRows(t, rows(t, s), []row{{"t", `<x> "q" & é`,
			`{"account":"\u003cx\u003e \"q\" \u0026 é","amount":1,"balance":1,"feed":"f","epoch":"e","position":4}`, 4, 0}})
	})

	// JSON cannot carry invalid UTF-8: json.Marshal turns each bad byte into
	// U+FFFD, so accounts "\xff" and "\xfe" would both be published as
	// "\ufffd" while keyed and stored apart. Such an account must be
	// malformed, or its output must name it exactly.
	t.Run("InvalidUTF8Account", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		for i, line := range []string{"\xff,1", "\xfe,1"} {
			err := apply(t, tx, p, delivery(int64(i+1)), line)
			if pe, ok := ingest.IsPermanent(err); ok && pe.Reason == ingest.ReasonMalformed {
				continue
			}
			must(t, err)
		}
		must(t, tx.Commit())
		for _, r := range rows(t, s) {
			var o ledger.Output
			must(t, json.Unmarshal([]byte(r.Value), &o))
			if o.Account != r.Key {
				t.Errorf("output at %d names account %q, its key is %q", r.Position, o.Account, r.Key)
			}
		}
	})

	t.Run("ErrMalformed", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		for _, line := range []string{"", "a", ",5", "a,", "a,1.5", "a,1,2", "a,9223372036854775808"} {
			err := apply(t, tx, p, delivery(1), line)
			pe, ok := ingest.IsPermanent(err)
			if !ok {
				t.Fatalf("Apply(%q) = %v, want a permanent error", line, err)
			}
			if pe.Reason != ingest.ReasonMalformed {
				t.Fatalf("Apply(%q) reason = %q, want %q", line, pe.Reason, ingest.ReasonMalformed)
			}
		}
		if tx.Emitted() != 0 {
			t.Fatalf("Emitted() = %d after malformed lines", tx.Emitted())
		}
		must(t, tx.Commit())
		if got := balances(t, s, "f"); len(got) != 0 {
			t.Fatalf("balances = %v", got)
		}
		sameRows(t, rows(t, s), nil)
	})

	for _, c := range []struct {
		name, first, second string
		balance             int64
		err                 string
	}{
		{"ErrBalanceOverflow", "a,9223372036854775807", "a,1", math.MaxInt64,
			`malformed: amount 1 would overflow the balance 9223372036854775807 of "a"`},
		{"ErrBalanceUnderflow", "a,-9223372036854775808", "a,-1", math.MinInt64,
			`malformed: amount -1 would overflow the balance -9223372036854775808 of "a"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := outboxtest.TempStore(t)
			p := ledger.New("t")
			tx, err := s.Begin(ctx)
			must(t, err)
			defer tx.Rollback()
			must(t, apply(t, tx, p, delivery(1), c.first))

			// Apply directly, without the item's rollback: the overflow is
			// caught before anything is written.
			must(t, tx.BeginItem(delivery(2).Place()))
			err = p.Apply(ctx, tx, delivery(2), ingest.Item{Value: []byte(c.second)})
			pe, ok := ingest.IsPermanent(err)
			if !ok || pe.Reason != ingest.ReasonMalformed {
				t.Fatalf("Apply(%q) = %v, want a permanent malformed error", c.second, err)
			}
			if err.Error() != c.err {
				t.Fatalf("error = %q, want %q", err, c.err)
			}
			if tx.Emitted() != 1 {
				t.Fatalf("Emitted() = %d, want 1", tx.Emitted())
			}
			must(t, tx.EndItem())
			must(t, tx.Commit())

			if got := balances(t, s, "f"); !maps.Equal(got, map[string]int64{"a": c.balance}) {
				t.Fatalf("balances = %v, want a: %d", got, c.balance)
			}
			var lines int
			must(t, outboxtest.Get(context.Background(), s, &lines, `SELECT lines FROM ledger_balances WHERE feed = 'f' AND account = 'a'`))
			if lines != 1 {
				t.Fatalf("lines = %d, want 1", lines)
			}
			if got := rows(t, s); len(got) != 1 || got[0].Position != 1 {
				t.Fatalf("rows = %+v, want the first line's only", got)
			}
		})
	}

	t.Run("BalanceAtLimitsStillMoves", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(1), "a,9223372036854775807"))
		must(t, apply(t, tx, p, delivery(2), "a,-9223372036854775808"))
		// max + min = -1; -1 - max = min exactly.
		must(t, apply(t, tx, p, delivery(3), "a,-9223372036854775807"))
		must(t, tx.Commit())
		if got := balances(t, s, "f"); !maps.Equal(got, map[string]int64{"a": math.MinInt64}) {
			t.Fatalf("balances = %v, want a: %d", got, int64(math.MinInt64))
		}
	})

	// An item rolled back after the batch's first change of its account
	// takes the account out of the batch; later ones add it again.
	t.Run("RolledBackNewAccountLeavesNoTrace", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(1), "a,5"))
		must(t, tx.BeginItem(delivery(2).Place()))
		must(t, p.Apply(ctx, tx, delivery(2), ingest.Item{Value: []byte("b,7")}))
		must(t, tx.RollbackItem())
		must(t, apply(t, tx, p, delivery(2), "c,1"))
		must(t, apply(t, tx, p, delivery(3), "b,2"))
		must(t, apply(t, tx, p, delivery(4), "a,1"))
		must(t, tx.Commit())
		if got, want := balances(t, s, "f"), map[string]int64{"a": 6, "b": 2, "c": 1}; !maps.Equal(got, want) {
			t.Fatalf("balances = %v, want %v", got, want)
		}
		var lines []int64
		must(t, s.View(ctx, func(r *outbox.ReadTx) error {
			return r.Select(ctx, &lines, `SELECT lines FROM ledger_balances WHERE feed = 'f' ORDER BY account`)
		}))
		if want := []int64{2, 1, 1}; !slices.Equal(lines, want) {
			t.Fatalf("lines of a, b, c = %v, want %v", lines, want)
		}
	})

	t.Run("RolledBackItemLeavesNoTrace", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(1), "a,5"))
		must(t, tx.BeginItem(delivery(2).Place()))
		must(t, p.Apply(ctx, tx, delivery(2), ingest.Item{Value: []byte("a,10")}))
		must(t, tx.RollbackItem())
		must(t, apply(t, tx, p, delivery(2), "a,1"))
		must(t, tx.Commit())
		if got := balances(t, s, "f"); !maps.Equal(got, map[string]int64{"a": 6}) {
			t.Fatalf("balances = %v, want a: 6", got)
		}
		sameRows(t, rows(t, s), []row{
			{"t", "a", `{"account":"a","amount":5,"balance":5,"feed":"f","epoch":"e","position":1}`, 1, 0},
			{"t", "a", `{"account":"a","amount":1,"balance":6,"feed":"f","epoch":"e","position":2}`, 2, 0},
		})
	})
}
