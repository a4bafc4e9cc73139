package outbox

import "sync"

// recentRows keeps the rows of the latest commits in memory, in id order
// with no gap, so the relay can publish a row it is about to read back
// without reading it: the ingest writer already had it in hand. It is a
// cache and nothing more. An id is never reused, so a row in it is the
// row SQLite holds under that id; a row missing from it is read from
// SQLite. It holds about maxRecentRows rows: when the relay falls behind
// (Kafka down, a backlog, no relay at all), the oldest commits' rows are
// dropped and read back later.
type recentRows struct {
	mu   sync.Mutex
	segs [][]Row // one per commit, oldest first, ids consecutive across them
	n    int     // rows in segs
}

// maxRecentRows bounds the cache: a few relay batches, a few MiB.
const maxRecentRows = 1 << 15

// add appends the rows of a commit, which the cache then owns. Rows that
// do not follow the cached ones (another writer's ids came between)
// replace them.
func (c *recentRows) add(rows []Row) {
	if len(rows) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if last := c.last(); last != nil && last.ID+1 != rows[0].ID {
		c.segs, c.n = nil, 0
	}
	if len(rows) > maxRecentRows {
		rows = rows[len(rows)-maxRecentRows:]
	}
	c.segs = append(c.segs, rows)
	c.n += len(rows)
	for c.n > maxRecentRows {
		c.n -= len(c.segs[0])
		c.segs[0] = nil
		c.segs = c.segs[1:]
	}
}

func (c *recentRows) last() *Row {
	if len(c.segs) == 0 {
		return nil
	}
	s := c.segs[len(c.segs)-1]
	return &s[len(s)-1]
}

// after returns up to limit cached rows from id after+1 on, or nil when
// row after+1 is not cached. Rows up to after are dropped: the caller, the
// relay, has published them. The rows' slices are shared and must not be
// changed.
func (c *recentRows) after(after int64, limit int) []Row {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.segs) > 0 {
		s := c.segs[0]
		if s[len(s)-1].ID > after {
			if k := after + 1 - s[0].ID; k > 0 {
				c.segs[0] = s[k:]
				c.n -= int(k)
			}
			break
		}
		c.n -= len(s)
		c.segs[0] = nil
		c.segs = c.segs[1:]
	}
	if len(c.segs) == 0 || c.segs[0][0].ID != after+1 {
		return nil
	}
	rows := make([]Row, 0, min(limit, c.n))
	for _, s := range c.segs {
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
// RelayRows returns; their slices are shared and must not be changed.
func (s *Store) RecentRows(after int64, limit int) []Row {
	return s.recent.after(after, limit)
}
