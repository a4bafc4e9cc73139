package outbox

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// BacklogLimit bounds the outbox backlog: the rows not yet published and
// their bytes (see Pending). A zero field sets no bound.
type BacklogLimit struct {
	Bytes int64
	Rows  int64
}

// IsZero reports whether l bounds nothing.
func (l BacklogLimit) IsZero() bool { return l.Bytes <= 0 && l.Rows <= 0 }

// Exceeded reports whether p is past l: more bytes or more rows than it
// allows.
func (l BacklogLimit) Exceeded(p Pending) bool {
	return (l.Bytes > 0 && p.Bytes > l.Bytes) || (l.Rows > 0 && p.Rows > l.Rows)
}

// Below reports whether p is at most frac of each of l's bounds: where
// ingest held back by the bound resumes, a little below it, so that it
// does not pause and resume at every batch.
func (l BacklogLimit) Below(p Pending, frac float64) bool {
	return (l.Bytes <= 0 || float64(p.Bytes) <= frac*float64(l.Bytes)) &&
		(l.Rows <= 0 || float64(p.Rows) <= frac*float64(l.Rows))
}

// Pending is the outbox backlog: the rows after the last one published,
// and the bytes of their chunks (about what they take on disk).
type Pending struct {
	Rows  int64 `json:"rows"`
	Bytes int64 `json:"bytes"`
}

// chunkOverhead is what a chunk costs SQLite beyond its body and texts:
// its integers, the record header, the b-tree cell and its page's share of
// slack. Measured with ledger-like outputs (TestStore_BacklogBytesOnDisk):
// the database grows by about chunkBytes per chunk.
const chunkOverhead = 48

// chunkBytes is what a chunk counts in the backlog: about what it takes on
// disk, its body as stored (compressed or not).
func chunkBytes(body []byte, feed, epoch, topic string) int64 {
	return int64(len(body) + len(feed) + len(epoch) + len(topic) + chunkOverhead)
}

// maxMarks bounds backlogMeter's marks (16 bytes each): past it,
// neighbours merge, and a merged pair counts as pending until its last row
// is published.
const maxMarks = 1 << 12

// backlogMark is a run of outbox rows: those after the previous mark's
// last id up to last, holding bytes.
type backlogMark struct {
	last  int64
	bytes int64
}

// backlogMeter follows the outbox backlog in memory, so that an ingest
// loop can ask for it between batches at no cost: every commit adds a
// mark (its last id and the bytes it wrote), every progress the relay
// stores drops the marks it covers. A mark only partly published counts
// whole, so the bytes are never under the truth, and over it by at most
// the mark's rows. The rows pending when the store opened are counted
// once, by a scan, the first time the backlog is asked for.
type backlogMeter struct {
	mu        sync.Mutex
	marks     []backlogMark // by last id
	bytes     int64         // the marks' bytes
	published int64         // the highest id stored as published
	lastID    int64         // the highest id written
	openLast  int64         // the last id when the store opened: rows up to it are scanned
	primed    bool          // the scan is done
	priming   sync.Mutex    // held while scanning
}

// opened sets what the meter starts from: the last id written and the
// last published when the store opened.
func (m *backlogMeter) opened(lastID, published int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastID, m.openLast, m.published = lastID, lastID, published
}

// committed adds the rows a commit wrote: up to id last, holding bytes.
func (m *backlogMeter) committed(last, bytes int64) {
	if last == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastID = max(m.lastID, last)
	if last <= m.published {
		return
	}
	m.insert(backlogMark{last, bytes})
}

// insert adds mk in id order: commits finish (and are counted) in the
// order they committed, but two may be counted the other way round.
func (m *backlogMeter) insert(mk backlogMark) {
	i := len(m.marks)
	for i > 0 && m.marks[i-1].last > mk.last {
		i--
	}
	m.marks = append(m.marks, backlogMark{})
	copy(m.marks[i+1:], m.marks[i:])
	m.marks[i] = mk
	m.bytes += mk.bytes
	if len(m.marks) > maxMarks {
		m.merge()
	}
}

// merge halves the marks, each pair becoming one.
func (m *backlogMeter) merge() {
	out := m.marks[:0]
	for i := 0; i < len(m.marks); i += 2 {
		mk := m.marks[i]
		if i+1 < len(m.marks) {
			mk = backlogMark{m.marks[i+1].last, mk.bytes + m.marks[i+1].bytes}
		}
		out = append(out, mk)
	}
	m.marks = out
}

// publishedThrough drops the marks of rows up to id.
func (m *backlogMeter) publishedThrough(id int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id <= m.published {
		return
	}
	m.published = id
	n := sort.Search(len(m.marks), func(i int) bool { return m.marks[i].last > id })
	for _, mk := range m.marks[:n] {
		m.bytes -= mk.bytes
	}
	m.marks = append(m.marks[:0], m.marks[n:]...)
}

func (m *backlogMeter) pending() Pending {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Pending{Rows: max(m.lastID-m.published, 0), Bytes: m.bytes}
}

// PendingBacklog returns the outbox backlog: the rows after the last one
// stored as published (SetRelayProgress), and their bytes, never fewer
// than they are. It reads no row, except on its first call, which counts
// the rows that were pending when the store opened (a scan of their
// sizes). Safe for concurrent use.
func (s *Store) PendingBacklog(ctx context.Context) (Pending, error) {
	if err := s.primeBacklog(ctx); err != nil {
		return Pending{}, err
	}
	return s.meter.pending(), nil
}

// primeBacklog counts, once, the rows pending when the store opened:
// marks of about scanMarkRows rows each.
func (s *Store) primeBacklog(ctx context.Context) error {
	m := &s.meter
	m.priming.Lock()
	defer m.priming.Unlock()
	m.mu.Lock()
	primed, from, to := m.primed, m.published, m.openLast
	m.mu.Unlock()
	if primed {
		return nil
	}
	marks, err := s.scanBacklog(ctx, from, to)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mk := range marks {
		if mk.last > m.published {
			m.insert(mk)
		}
	}
	m.primed = true
	return nil
}

// scanMarkRows is the size of the marks a scan makes.
const scanMarkRows = 4096

// scanBacklog reads the sizes of the rows in (from, to], in marks of
// whole chunks: the chunk holding from counts whole, so the bytes are never
// under the truth.
func (s *Store) scanBacklog(ctx context.Context, from, to int64) ([]backlogMark, error) {
	if to <= from {
		return nil, nil
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT last_id, count, bytes FROM outbox_chunks
WHERE last_id > ? AND last_id <= ? ORDER BY last_id`, from, to)
	if err != nil {
		return nil, fmt.Errorf("count the outbox backlog: %w", err)
	}
	defer rows.Close()
	var marks []backlogMark
	var cur backlogMark
	n := int64(0)
	for rows.Next() {
		var id, count, b int64
		if err := rows.Scan(&id, &count, &b); err != nil {
			return nil, fmt.Errorf("count the outbox backlog: %w", err)
		}
		cur.last, cur.bytes = id, cur.bytes+b
		if n += count; n >= scanMarkRows {
			marks, cur, n = append(marks, cur), backlogMark{}, 0
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count the outbox backlog: %w", err)
	}
	if n > 0 {
		marks = append(marks, cur)
	}
	return marks, nil
}

// FreeSpace is the space this process may still write on dir's file
// system (root may use the blocks reserved for it); known is false where
// it is not measured (off Linux).
func FreeSpace(dir string) (n uint64, known bool, err error) {
	n, err = freeBytes(dir)
	return n, freeKnown, err
}
