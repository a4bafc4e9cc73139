package sqlproc_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// goldenCases are ledger lines chosen for the ways the Go ledger reads
// them: trimming, signs, overflow, quotes, characters encoding/json
// escapes, text that is not UTF-8, and every way a line is malformed.
var goldenCases = []string{
	"a,5", " a , -5 ", "\ta\t,\t7\r", "a,+7", "a,0", "a,-0", "a,007", "+0000000000000000000005,1",
	"my savings account,12", "  café ☕ Ωmega ,3", "\u00a0a\u2003,\u30001", `"a",1`, `"quoted, not",1`,
	"007,1", "12,2", "-3,3", "1e3,4",
	"<b>&amp;</b>,1", "line\u2028sep\u2029para,2", "ctl\x01\x1f\x7f,3", "tab\tin,4", `back\slash "q",5`, "a/b,6",
	"\xff\xfe,1", "acct,\xff1", "caf\xc3,1", "\xed\xa0\x80,1",
	"big,9223372036854775807", "big,1", "big,-1", "big,1", "small,-9223372036854775808", "small,-1", "small,1", "small,-2",
	"", "no comma here", "a 5", "a;5", ",5", "   ,5", ",", "a,", "a,   ", "a,12z", "a,1.5", "a,0x10", "a,1_000",
	"a,1e3", "a,1 000", "a,+-1", "a,-", "a,9223372036854775808", "a,-9223372036854775809", "a,1,2", "a,1,", "a,１２",
}

// goldenInput is the cases, then n random lines mixing valid and malformed
// ones over accounts with awkward names.
func goldenInput(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	accounts := []string{"acct-1", "acct-2", "Ωmega", "<x>", "a&b", "new\u2028line", "007", "tab\tx", `q"uote`, "spa ce"}
	spaces := []string{"", "", "", " ", "\t", "\u00a0", "\u3000 "}
	bad := []string{"", "nope", ",1", "x,", "x,1.0", "x,1,2", "\xffx,1", "x,99999999999999999999"}
	lines := append([]string(nil), goldenCases...)
	for range n {
		if rng.IntN(20) == 0 {
			lines = append(lines, bad[rng.IntN(len(bad))])
			continue
		}
		acct := accounts[rng.IntN(len(accounts))]
		amt := strconv.FormatInt(rng.Int64N(2001)-1000, 10)
		switch rng.IntN(50) {
		case 0:
			amt = strconv.FormatInt(math.MaxInt64-rng.Int64N(3), 10) // overflows some balances
		case 1:
			amt = "+" + amt
		}
		sp := func() string { return spaces[rng.IntN(len(spaces))] }
		lines = append(lines, sp()+acct+sp()+","+sp()+amt+sp())
	}
	return lines
}

// TestGolden_Ledger runs the Go ledger and the SQL ledger of
// testdata/ledger.yaml through the real file feed and loop, each into its
// own store, over the same file: the outputs (topic, key, value, headers,
// by position), the dead letters (positions and reasons) and the balances
// are the same, byte for byte.
func TestGolden_Ledger(t *testing.T) {
	lines := goldenInput(3000, 1)
	path, ends := writeLines(t, lines...)
	end := ends[len(ends)-1]

	goStore := openStore(t, nil)
	goRun := startLoop(t, goStore, "ledger", path, ledger.New("ledger.out"), nil)
	sqlStore := openStore(t, nil)
	sqlRun := startLoop(t, sqlStore, "ledger", path, newProc(t, loadConfig(t, "ledger", "testdata/ledger.yaml")), nil)
	waitApplied(t, goStore, "ledger", end)
	waitApplied(t, sqlStore, "ledger", end)
	goRun.stop(t)
	sqlRun.stop(t)

	goOut, sqlOut := ledgerOutputs(t, goStore), ledgerOutputs(t, sqlStore)
	if len(goOut) < 2500 {
		t.Fatalf("the Go ledger made %d outputs of %d lines: the input is not what the test means", len(goOut), len(lines))
	}
	for i := range max(len(goOut), len(sqlOut)) {
		if i >= len(goOut) || i >= len(sqlOut) || !reflect.DeepEqual(goOut[i], sqlOut[i]) {
			t.Fatalf("output %d of %d/%d differs:\n Go:  %s\n SQL: %s", i, len(goOut), len(sqlOut), describe(goOut, i), describe(sqlOut, i))
		}
	}
	if !bytes.Contains(joinValues(goOut), []byte(`\u003cx\u003e`)) || !bytes.Contains(joinValues(goOut), []byte(`\u2028`)) {
		t.Fatal("no output holds an escaped character: the input is not what the test means")
	}

	goDead, sqlDead := deadPlaces(t, goStore), deadPlaces(t, sqlStore)
	if len(goDead) < 100 {
		t.Fatalf("the Go ledger dead-lettered %d lines: the input is not what the test means", len(goDead))
	}
	if !reflect.DeepEqual(goDead, sqlDead) {
		t.Fatalf("dead letters differ:\n Go:  %v\n SQL: %v", goDead, sqlDead)
	}
	for i, dl := range deadLetters(t, sqlStore, "ledger") {
		if want := lineAt(lines, ends, dl.Position); string(dl.Payload) != want {
			t.Fatalf("dead letter %d holds %q, want the line %q", i, dl.Payload, want)
		}
	}

	goBal, err := ledger.Balances(context.Background(), goStore, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if sqlBal := sqlBalances(t, sqlStore); !reflect.DeepEqual(goBal, sqlBal) || len(goBal) < 10 {
		t.Fatalf("balances differ:\n Go:  %v\n SQL: %v", goBal, sqlBal)
	}
	t.Logf("%d lines: %d outputs, %d dead letters, %d accounts, all equal", len(lines), len(goOut), len(goDead), len(goBal))
}

// ledgerRow is an output as the golden test compares it.
type ledgerRow struct {
	Position      int64
	N             int
	Topic         string
	Key, Value    []byte
	Headers       []byte
	KeyNil, ValNl bool
}

func ledgerOutputs(t *testing.T, s *outbox.Store) []ledgerRow {
	t.Helper()
	var out []ledgerRow
	for _, r := range rows(t, s) {
		if r.Topic == "ledger.dlq" {
			continue // dead letters are compared by place and reason: their error texts differ
		}
		out = append(out, ledgerRow{Position: r.Position, N: r.N, Topic: r.Topic, Key: r.Key, Value: r.Value,
			Headers: r.Headers, KeyNil: r.Key == nil, ValNl: r.Value == nil})
	}
	return out
}

func describe(rs []ledgerRow, i int) string {
	if i >= len(rs) {
		return "(none)"
	}
	r := rs[i]
	return fmt.Sprintf("%d/%d %s key=%q value=%q headers=%q", r.Position, r.N, r.Topic, r.Key, r.Value, r.Headers)
}

func joinValues(rs []ledgerRow) []byte {
	var b []byte
	for _, r := range rs {
		b = append(b, r.Value...)
	}
	return b
}

// deadPlaces lists a feed's dead letters as "position reason", and the
// reason header of their outputs on the dead-letter topic.
func deadPlaces(t *testing.T, s *outbox.Store) []string {
	t.Helper()
	var out []string
	for _, dl := range deadLetters(t, s, "ledger") {
		out = append(out, fmt.Sprintf("%d %s", dl.Position, dl.Reason))
	}
	for _, r := range rows(t, s) {
		if r.Topic != "ledger.dlq" {
			continue
		}
		hs, err := outbox.DecodeHeaders(r.Headers)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if h.Key == ingest.HeaderReason {
				out = append(out, fmt.Sprintf("dlq %d %q %s", r.Position, r.Value, h.Value))
			}
		}
	}
	return out
}

func lineAt(lines []string, ends []int64, pos int64) string {
	for i, e := range ends {
		if e == pos {
			return strings.TrimSuffix(lines[i], "\r")
		}
	}
	return "(no line ends there)"
}

func sqlBalances(t *testing.T, s *outbox.Store) map[string]int64 {
	t.Helper()
	m, err := outboxtest.Balances(context.Background(), s, "balances")
	if err != nil {
		t.Fatal(err)
	}
	return m
}
