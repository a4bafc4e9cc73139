package ledger

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSortChanged checks the prefix-keyed sort against a plain bytewise
// sort of the same accounts: shared prefixes, accounts that begin others,
// zero and high bytes, and pairs equal in their first eight bytes after
// the shared prefix.
func TestSortChanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte{0, 1, 'a', 'b', '9', 0x7f, 0xff}
	for round := range 200 {
		prefix := strings.Repeat("acct-", round%3)
		seen := map[string]bool{}
		var order []changed
		for range 1 + rng.IntN(300) {
			b := []byte(prefix)
			for range rng.IntN(14) {
				b = append(b, alphabet[rng.IntN(len(alphabet))])
			}
			a := string(b)
			if seen[a] {
				continue
			}
			seen[a] = true
			order = append(order, changed{k: balanceKey{"f", a}, c: &change{}})
		}
		want := make([]string, 0, len(order))
		for _, e := range order {
			want = append(want, e.k.account)
		}
		slices.Sort(want)
		sortChanged(order)
		got := make([]string, 0, len(order))
		for _, e := range order {
			got = append(got, e.k.account)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: sorted %q, want %q", round, got, want)
		}
	}
}

// TestSortChanged_Feeds checks the order by feed, then account, when
// several feeds changed accounts in one batch.
func TestSortChanged_Feeds(t *testing.T) {
	order := []changed{{k: balanceKey{"g", "a"}}, {k: balanceKey{"f", "b"}}, {k: balanceKey{"f", "a"}}, {k: balanceKey{"g", ""}}}
	sortChanged(order)
	var got []balanceKey
	for _, e := range order {
		got = append(got, e.k)
	}
	want := []balanceKey{{"f", "a"}, {"f", "b"}, {"g", ""}, {"g", "a"}}
	if !slices.Equal(got, want) {
		t.Fatalf("sorted %v, want %v", got, want)
	}
}

// BenchmarkSortChanged sorts a batch's 16,000 changed accounts of a
// million, as the batch's write does (prefix), against a sort by the
// accounts' bytes alone (bytewise).
func BenchmarkSortChanged(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	base := make([]changed, 16000)
	for i := range base {
		base[i] = changed{k: balanceKey{"ledger", "acct-" + strconv.Itoa(rng.IntN(1_000_000))}}
	}
	order := make([]changed, len(base))
	b.Run("prefix", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			copy(order, base)
			sortChanged(order)
		}
	})
	b.Run("bytewise", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			copy(order, base)
			slices.SortFunc(order, func(x, y changed) int { return strings.Compare(x.k.account, y.k.account) })
		}
	})
}
