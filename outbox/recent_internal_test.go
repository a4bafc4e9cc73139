package outbox

import "testing"

// seqRows returns n rows with ids from first on and values of size bytes.
func seqRows(first int64, n, size int) []Row {
	rows := make([]Row, n)
	for i := range rows {
		rows[i] = Row{ID: first + int64(i), Value: make([]byte, size)}
	}
	return rows
}

func TestRecentRows_Bounds(t *testing.T) {
	t.Run("Rows", func(t *testing.T) {
		var c recentRows
		c.add(seqRows(1, maxRecentRows+10, 0))
		if c.n != maxRecentRows || c.segs[0].rows[0].ID != 11 {
			t.Fatalf("cached %d rows from id %d, want %d from 11", c.n, c.segs[0].rows[0].ID, maxRecentRows)
		}
		c.add(seqRows(maxRecentRows+11, 1, 0))
		if c.n != 1 || c.segs[0].rows[0].ID != maxRecentRows+11 {
			t.Fatalf("after one more row: %d rows from id %d, want the new commit alone", c.n, c.segs[0].rows[0].ID)
		}
	})
	t.Run("Bytes", func(t *testing.T) {
		var c recentRows
		const size = 4096
		per := int64(cachedRowOverhead + size)
		fit := int(maxRecentBytes / per)
		c.add(seqRows(1, fit-1, size))
		c.add(seqRows(int64(fit), 1, size))
		if c.n != fit || c.bytes != int64(fit)*per || len(c.segs) != 2 {
			t.Fatalf("cached %d rows, %d bytes in %d commits, want %d rows, %d bytes in 2", c.n, c.bytes, len(c.segs), fit, int64(fit)*per)
		}
		c.add(seqRows(int64(fit)+1, 1, size))
		if c.n != 2 || c.segs[0].rows[0].ID != int64(fit) {
			t.Fatalf("past the bound: %d rows from id %d, want the two newest commits", c.n, c.segs[0].rows[0].ID)
		}
		rows := c.after(int64(fit), 10)
		if len(rows) != 1 || rows[0].ID != int64(fit)+1 || c.n != 1 || c.bytes != per {
			t.Fatalf("after(%d) = %d rows; cache %d rows, %d bytes; want row %d and the cache holding it alone",
				fit, len(rows), c.n, c.bytes, fit+1)
		}
	})
	t.Run("HugeRow", func(t *testing.T) {
		var c recentRows
		c.add(seqRows(1, 1, maxRecentBytes))
		if c.n != 0 || c.bytes != 0 || c.after(0, 1) != nil {
			t.Fatalf("a row over the byte bound is cached: %d rows, %d bytes", c.n, c.bytes)
		}
	})
}
