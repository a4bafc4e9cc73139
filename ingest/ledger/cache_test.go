package ledger

import (
	"strconv"
	"testing"

	"github.com/VictoriaMetrics/fastcache"
)

func TestBalanceCache(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		c := newBalanceCache(CacheBytes)
		defer c.reset()
		if _, ok := c.get(balanceKey{"f", "a"}); ok {
			t.Fatal("empty cache has a balance")
		}
		c.set(balanceKey{"f", "a"}, -42)
		c.set(balanceKey{"f", "b"}, 1<<62)
		c.set(balanceKey{"f", "a"}, 7) // replaced
		for k, want := range map[balanceKey]int64{{"f", "a"}: 7, {"f", "b"}: 1 << 62} {
			if got, ok := c.get(k); !ok || got != want {
				t.Errorf("get(%v) = %d, %v; want %d", k, got, ok, want)
			}
		}
	})
	t.Run("KeysDoNotCollide", func(t *testing.T) {
		// ("ab", "c") and ("a", "bc") concatenate alike; their keys must not.
		c := newBalanceCache(CacheBytes)
		defer c.reset()
		c.set(balanceKey{"ab", "c"}, 1)
		if got, ok := c.get(balanceKey{"a", "bc"}); ok {
			t.Fatalf("(a, bc) found (ab, c)'s balance %d", got)
		}
		if _, ok := c.get(balanceKey{"ab", "c\x00"}); ok {
			t.Fatal("a longer account found a shorter one's balance")
		}
		_, bc := c.lookup("a", []byte("bc"))
		v, c1 := c.lookup("ab", []byte("c"))
		_, c0 := c.lookup("ab", []byte("c\x00"))
		if bc || !c1 || v != 1 || c0 {
			t.Fatal("lookup does not find exactly what get does")
		}
	})
	t.Run("OversizedAccountIsNotKept", func(t *testing.T) {
		c := newBalanceCache(CacheBytes)
		defer c.reset()
		big := string(make([]byte, 70<<10))
		c.set(balanceKey{"f", big}, 5)
		if _, ok := c.get(balanceKey{"f", big}); ok {
			t.Fatal("an entry over fastcache's 64 KiB limit was kept")
		}
	})
	t.Run("Bounded", func(t *testing.T) {
		// More entries than fit: the bytes held stay within the
		// bound, the newest entries are there, and what was dropped is a
		// miss, never a wrong balance.
		c := newBalanceCache(32 << 20)
		defer c.reset()
		const n = 3 << 19
		for i := range n {
			c.set(balanceKey{"ledger", "acct-" + strconv.Itoa(i)}, int64(i))
		}
		var st fastcache.Stats
		c.c.UpdateStats(&st)
		if st.BytesSize > 32<<20 {
			t.Errorf("cache holds %d bytes, bound %d", st.BytesSize, 32<<20)
		}
		hits := 0
		for i := range n {
			got, ok := c.get(balanceKey{"ledger", "acct-" + strconv.Itoa(i)})
			if ok && got != int64(i) {
				t.Fatalf("acct-%d: balance %d", i, got)
			}
			if ok {
				hits++
			}
		}
		if hits == 0 || hits == n {
			t.Errorf("%d of %d entries kept, want some but not all", hits, n)
		}
		if _, ok := c.get(balanceKey{"ledger", "acct-" + strconv.Itoa(n-1)}); !ok {
			t.Error("the newest entry was dropped")
		}
	})
}
