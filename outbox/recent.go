package outbox

import "sync"

// recentRows keeps the rows of the latest commits in memory, in id order
// with no gap, so the relay can publish a row it is about to read back
// without reading it: the ingest writer already had it in hand. It is a
// cache and nothing more. An id is never reused, so a row in it is the
// row SQLite holds under that id; a row missing from it is read from
// SQLite. It holds at most maxRecentRows rows: when the relay falls behind
// (Kafka down, a backlog), the oldest are dropped and read back later.
type recentRows struct {
	mu   sync.Mutex
	rows []Row
}

// maxRecentRows bounds the cache: a few relay batches, a few MiB.
const maxRecentRows = 1 << 15

// add appends the rows of a commit. Rows that do not follow the cached
// ones (another writer's ids came between) replace them.
func (c *recentRows) add(rows []Row) {
	if len(rows) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.rows); n > 0 && c.rows[n-1].ID+1 != rows[0].ID {
		c.rows = nil
	}
	if len(rows) >= maxRecentRows {
		c.rows = append([]Row(nil), rows[len(rows)-maxRecentRows:]...)
		return
	}
	if len(c.rows)+len(rows) > maxRecentRows {
		// Drop the oldest half into a new array, so the dropped rows'
		// bytes are freed rather than kept by the array's head.
		keep := c.rows[len(c.rows)/2:]
		c.rows = append(make([]Row, 0, len(keep)+len(rows)), keep...)
	}
	c.rows = append(c.rows, rows...)
}

// after returns up to limit cached rows from id after+1 on, or nil when
// row after+1 is not cached. Rows up to after are dropped: the caller, the
// relay, has published them. The rows' slices are shared and must not be
// changed.
func (c *recentRows) after(after int64, limit int) []Row {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	if n := len(c.rows); n > 0 {
		i = int(min(max(after+1-c.rows[0].ID, 0), int64(n)))
	}
	c.rows = c.rows[i:]
	if len(c.rows) == 0 {
		c.rows = nil
		return nil
	}
	if c.rows[0].ID != after+1 {
		return nil
	}
	return append([]Row(nil), c.rows[:min(limit, len(c.rows))]...)
}

// RecentRows returns up to limit rows with id > after, in id order, from
// the rows this store's own commits wrote lately, or nil when the row
// after+1 is not among them; then Rows or RelayRows read it. It costs no
// SQLite read; rows up to after are forgotten. The rows are exactly those
// RelayRows returns; their slices are shared and must not be changed.
func (s *Store) RecentRows(after int64, limit int) []Row {
	return s.recent.after(after, limit)
}
