package ledger

import (
	"encoding/binary"

	"github.com/VictoriaMetrics/fastcache"
)

// CacheBytes bounds the memory of the committed balances a Processor keeps:
// about a million accounts (fastcache's smallest size). Past it the oldest writes are overwritten and
// their balances read from SQLite again; the database holds them all.
const CacheBytes = 32 << 20

// balanceCache holds committed balances by (feed, account), in at most
// CacheBytes. fastcache keeps its entries outside Go's heap, so the cache
// neither adds to the collector's work nor moves its target, and checks a
// whole key on every hit: a hash collision is a miss, never another
// account's balance. An entry too large for it (an account of about 64 KiB)
// is not kept, and is read from SQLite each batch.
type balanceCache struct {
	c   *fastcache.Cache
	key []byte // scratch: the encoded key
	val []byte // scratch: the encoded balance
}

func newBalanceCache(maxBytes int) *balanceCache {
	return &balanceCache{c: fastcache.New(maxBytes)}
}

// encode makes the cache key of k: the feed's length, the feed, the
// account, so that no two (feed, account) pairs share one.
func (c *balanceCache) encode(k balanceKey) []byte {
	b := binary.AppendUvarint(c.key[:0], uint64(len(k.feed)))
	b = append(b, k.feed...)
	c.key = append(b, k.account...)
	return c.key
}

// lookup returns the committed balance of account of feed, if the cache
// has it.
func (c *balanceCache) lookup(feed string, account []byte) (int64, bool) {
	b := binary.AppendUvarint(c.key[:0], uint64(len(feed)))
	b = append(b, feed...)
	c.key = append(b, account...)
	v, ok := c.c.HasGet(c.val[:0], c.key)
	if ok {
		c.val = v
	}
	if !ok || len(v) != 8 {
		return 0, false
	}
	return int64(binary.LittleEndian.Uint64(v)), true
}

// get returns k's committed balance, if the cache has it.
func (c *balanceCache) get(k balanceKey) (int64, bool) {
	v, ok := c.c.HasGet(c.val[:0], c.encode(k))
	if !ok || len(v) != 8 {
		return 0, false
	}
	c.val = v
	return int64(binary.LittleEndian.Uint64(v)), true
}

// set records k's committed balance.
func (c *balanceCache) set(k balanceKey, balance int64) {
	c.val = binary.LittleEndian.AppendUint64(c.val[:0], uint64(balance))
	c.c.Set(c.encode(k), c.val)
}

// reset drops every entry and gives the memory back to fastcache's pool.
func (c *balanceCache) reset() { c.c.Reset() }
