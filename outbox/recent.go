package outbox

import "sync"

// recentRows keeps the rows of the latest commits in memory, in id order
// with no gap, so the relay can publish a row it is about to read back
// without reading it: the ingest writer already had it in hand. It is a
// cache and nothing more. An id is never reused, so a row in it is the
// row SQLite holds under that id; a row missing from it is read from
// SQLite. It holds at most maxRecentRows rows and about maxRecentBytes
// bytes: when the relay falls behind (Kafka down, a backlog, no relay at
// all), the oldest commits' rows are dropped and read back later.
type recentRows struct {
	mu    sync.Mutex
	segs  []recentSeg // one per commit, oldest first, ids consecutive across them
	n     int         // rows in segs
	bytes int64       // cachedBytes of the rows in segs
}

// recentSeg is the rows of one commit still cached, and their bytes.
type recentSeg struct {
	rows  []Row
	bytes int64
}

// maxRecentRows and maxRecentBytes bound the cache. A relay that keeps up
// reads every row from it; one that falls behind by more than the cache
// reads from SQLite, which costs it more per row than publishing does and
// so puts it further behind. The bound is therefore well over a relay
// batch, but not so much that a server with no relay (or a stalled one)
// holds much memory for nothing: the garbage collector lets the heap grow
// to three times what is live (GOGC 200). With small rows the row count
// binds (about 23 MiB of rows of 20 bytes), with large ones the bytes
// (about 21,000 rows of 1 KiB).
const (
	maxRecentRows  = 1 << 17
	maxRecentBytes = 24 << 20
)

// cachedRowOverhead is what a cached Row costs beyond its key, value and
// headers: the struct itself (its strings are shared between the rows of
// a commit) and the slice it sits in.
const cachedRowOverhead = 160

// cachedBytes is what rows hold in memory, as the cache counts it.
func cachedBytes(rows []Row) int64 {
	n := int64(len(rows)) * cachedRowOverhead
	for i := range rows {
		n += int64(len(rows[i].Key) + len(rows[i].Value) + len(rows[i].Headers))
	}
	return n
}

// add appends the rows of a commit, which the cache then owns. Rows that
// do not follow the cached ones (another writer's ids came between)
// replace them. Of a commit over the bounds, only its newest rows are
// kept.
func (c *recentRows) add(rows []Row) {
	if len(rows) == 0 {
		return
	}
	rows, b := newestWithin(rows)
	c.mu.Lock()
	defer c.mu.Unlock()
	if last := c.last(); last != nil && last.ID+1 != rows[0].ID {
		c.segs, c.n, c.bytes = nil, 0, 0
	}
	c.segs = append(c.segs, recentSeg{rows: rows, bytes: b})
	c.n += len(rows)
	c.bytes += b
	for c.n > maxRecentRows || c.bytes > maxRecentBytes {
		c.dropOldest()
	}
}

// newestWithin returns the newest rows of rows within the cache's bounds
// (at least one), and their bytes.
func newestWithin(rows []Row) ([]Row, int64) {
	var b int64
	i := len(rows)
	for i > 0 && len(rows)-i < maxRecentRows {
		rb := cachedBytes(rows[i-1 : i])
		if b+rb > maxRecentBytes && i < len(rows) {
			break
		}
		b += rb
		i--
	}
	return rows[i:], b
}

// dropOldest forgets the oldest commit's rows.
func (c *recentRows) dropOldest() {
	c.n -= len(c.segs[0].rows)
	c.bytes -= c.segs[0].bytes
	c.segs[0] = recentSeg{}
	c.segs = c.segs[1:]
}

func (c *recentRows) last() *Row {
	if len(c.segs) == 0 {
		return nil
	}
	s := c.segs[len(c.segs)-1].rows
	return &s[len(s)-1]
}

// after returns up to limit cached rows from id after+1 on, or nil when
// row after+1 is not cached. Rows up to after are dropped: the caller, the
// relay, has published them. The rows, and within one commit the slice
// that holds them, are shared and must not be changed; the slice has no
// room beyond its length, so appending to it copies.
func (c *recentRows) after(after int64, limit int) []Row {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.segs) > 0 {
		s := c.segs[0].rows
		if s[len(s)-1].ID > after {
			if k := after + 1 - s[0].ID; k > 0 {
				gone := cachedBytes(s[:k])
				c.segs[0] = recentSeg{rows: s[k:], bytes: c.segs[0].bytes - gone}
				c.n -= int(k)
				c.bytes -= gone
			}
			break
		}
		c.dropOldest()
	}
	if len(c.segs) == 0 || c.segs[0].rows[0].ID != after+1 {
		return nil
	}
	if s := c.segs[0].rows; len(s) >= limit || len(c.segs) == 1 {
		// Within one commit: its rows as they are, with no room to append
		// to, so that a caller's append never writes into the cache.
		k := min(len(s), limit)
		return s[:k:k]
	}
	rows := make([]Row, 0, min(limit, c.n))
	for _, seg := range c.segs {
		s := seg.rows
		if len(rows) == limit {
			break
		}
		rows = append(rows, s[:min(len(s), limit-len(rows))]...)
	}
	return rows
}

// RecentRows returns up to limit rows with id > after, in id order, from
// the rows this store's own commits wrote lately, or nil when the row
// after+1 is not among them; then Rows or RelayRows read it. It costs no
// SQLite read; rows up to after are forgotten. The rows are exactly those
// RelayRows returns; they are shared and must not be changed (appending
// to the slice returned is safe: it copies).
func (s *Store) RecentRows(after int64, limit int) []Row {
	return s.recent.after(after, limit)
}
