package ledger_test

import (
	"context"
	"maps"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func items(lines ...string) []ingest.Item {
	var its []ingest.Item
	for _, l := range lines {
		its = append(its, ingest.Item{Value: []byte(l)})
	}
	return its
}

// committedBalances writes balances through a processor of their own, so
// that the processor under test holds none of them in its cache.
func committedBalances(t *testing.T, s *outbox.Store, feed string, lines ...string) {
	t.Helper()
	ctx := context.Background()
	p := ledger.New("setup")
	tx, err := s.Begin(ctx)
	must(t, err)
	defer tx.Rollback()
	for i, l := range lines {
		must(t, apply(t, tx, p, ingest.Delivery{Feed: feed, Epoch: "setup", Position: int64(i + 1)}, l))
	}
	must(t, tx.Commit())
}

func TestProcessor_Prepare(t *testing.T) {
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		s := outboxtest.TempStore(t)
		committedBalances(t, s, "f", "a,10", "b,-4", "d,7")
		committedBalances(t, s, "g", "a,100")
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		// c has no row; "bad" and ",1" do not parse; d is not shown and is
		// read on its own; g's a is another feed's.
		must(t, p.Prepare(ctx, tx, "f", items("a,1", "b,2", "c,3", "bad", ",1", "a,5")))
		must(t, apply(t, tx, p, delivery(1), "a,1"))
		must(t, apply(t, tx, p, delivery(2), "b,2"))
		must(t, apply(t, tx, p, delivery(3), "c,3"))
		if err := apply(t, tx, p, delivery(4), "bad"); err == nil {
			t.Fatal(`Apply("bad") succeeded`)
		}
		must(t, apply(t, tx, p, delivery(5), "a,5"))
		must(t, apply(t, tx, p, delivery(6), "d,1"))
		must(t, apply(t, tx, p, ingest.Delivery{Feed: "g", Epoch: "e", Position: 7}, "a,1"))
		must(t, tx.Commit())
		if got, want := balances(t, s, "f"), map[string]int64{"a": 16, "b": -2, "c": 3, "d": 8}; !maps.Equal(got, want) {
			t.Fatalf("balances of f = %v, want %v", got, want)
		}
		if got, want := balances(t, s, "g"), map[string]int64{"a": 101}; !maps.Equal(got, want) {
			t.Fatalf("balances of g = %v, want %v", got, want)
		}
		got := rows(t, s)[4:] // after the four of the set-up
		sameRows(t, got, []row{
			{"t", "a", `{"account":"a","amount":1,"balance":11,"feed":"f","epoch":"e","position":1}`, 1, 0},
			{"t", "b", `{"account":"b","amount":2,"balance":-2,"feed":"f","epoch":"e","position":2}`, 2, 0},
			{"t", "c", `{"account":"c","amount":3,"balance":3,"feed":"f","epoch":"e","position":3}`, 3, 0},
			{"t", "a", `{"account":"a","amount":5,"balance":16,"feed":"f","epoch":"e","position":5}`, 5, 0},
			{"t", "d", `{"account":"d","amount":1,"balance":8,"feed":"f","epoch":"e","position":6}`, 6, 0},
			{"t", "a", `{"account":"a","amount":1,"balance":101,"feed":"g","epoch":"e","position":7}`, 7, 0},
		})
	})

	t.Run("ManyAccountsInChunks", func(t *testing.T) {
		// More accounts than one read takes, and a count that is no power
		// of two: every chunk size is used.
		const n = 3*ledger.ReadChunk + 77
		s := outboxtest.TempStore(t)
		var setup, lines []string
		want := map[string]int64{}
		for i := range n {
			acct := "acct-" + string(rune('a'+i%26)) + "-" + itoa(i)
			if i%3 != 0 { // a third has no row yet
				setup = append(setup, acct+","+itoa(i))
			}
			lines = append(lines, acct+",1")
			want[acct] = 1
			if i%3 != 0 {
				want[acct] += int64(i)
			}
		}
		committedBalances(t, s, "f", setup...)
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, p.Prepare(ctx, tx, "f", items(lines...)))
		for i, l := range lines {
			must(t, apply(t, tx, p, delivery(int64(i+1)), l))
		}
		must(t, tx.Commit())
		if got := balances(t, s, "f"); !maps.Equal(got, want) {
			t.Fatalf("balances: %d accounts, want %d; first difference %s", len(got), len(want), firstDiff(got, want))
		}
	})

	t.Run("NothingKeptFromAnUncommittedBatch", func(t *testing.T) {
		// A batch that does not commit leaves its reads and changes behind:
		// the next one reads the committed balance again.
		s := outboxtest.TempStore(t)
		committedBalances(t, s, "f", "a,10")
		p := ledger.New("t")
		tx, err := s.Begin(ctx)
		must(t, err)
		must(t, p.Prepare(ctx, tx, "f", items("a,1")))
		must(t, apply(t, tx, p, delivery(1), "a,1"))
		must(t, tx.Rollback())

		tx, err = s.Begin(ctx)
		must(t, err)
		defer tx.Rollback()
		must(t, apply(t, tx, p, delivery(1), "a,2"))
		must(t, tx.Commit())
		if got, want := balances(t, s, "f"), map[string]int64{"a": 12}; !maps.Equal(got, want) {
			t.Fatalf("balances = %v, want %v", got, want)
		}
	})
}

func itoa(i int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}

func firstDiff(got, want map[string]int64) string {
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			return k + ": got " + itoa(int(g)) + ", want " + itoa(int(w))
		}
	}
	return "an account too many"
}
