package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// SinkProgress returns the last outbox id the sink named name stored as
// delivered (0 if none).
func (s *Store) SinkProgress(ctx context.Context, name string) (int64, error) {
	var id int64
	err := s.db.GetContext(ctx, &id, `SELECT last_id FROM sink_progress WHERE sink = ?`, name)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read progress of sink %s: %w", name, err)
	}
	return id, nil
}

const setSinkProgressSQL = `INSERT INTO sink_progress (sink, last_id, updated_at) VALUES (?, ?, ?)
ON CONFLICT(sink) DO UPDATE SET last_id = max(last_id, excluded.last_id), updated_at = excluded.updated_at`

// SetSinkProgress records that the sink named name holds (or passed over)
// every row up to lastID. The stored progress never moves back.
func (s *Store) SetSinkProgress(ctx context.Context, name string, lastID int64) error {
	st, err := s.prepared(ctx, setSinkProgressSQL)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(ctx, name, lastID, s.Now().UnixNano())
	s.noteWrite(err)
	if err != nil {
		return fmt.Errorf("store progress of sink %s: %w", name, err)
	}
	s.sinkStored(name, lastID)
	return nil
}

// SinkProgresses returns every sink's stored progress by name, those no
// longer configured included.
func (s *Store) SinkProgresses(ctx context.Context) (map[string]int64, error) {
	var rows []struct {
		Sink   string `db:"sink"`
		LastID int64  `db:"last_id"`
	}
	if err := s.rdb.SelectContext(ctx, &rows, `SELECT sink, last_id FROM sink_progress`); err != nil {
		return nil, fmt.Errorf("read sinks' progress: %w", err)
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Sink] = r.LastID
	}
	return out, nil
}

// Commits returns a channel closed after the next commit that writes
// output rows. Unlike Committed it serves any number of consumers: each
// takes the channel before it reads the rows, so that a commit after the
// read wakes it. Safe for concurrent use.
func (s *Store) Commits() <-chan struct{} { return s.commits.next() }

// commitBroadcast is the channel Commits hands out, closed and replaced at
// each commit that wrote rows.
type commitBroadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *commitBroadcast) next() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// fire wakes every consumer waiting on the current channel.
func (b *commitBroadcast) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// PendingAfter returns the backlog of a consumer that holds every row up
// to id after: the rows after it, and their bytes (a commit partly after
// it counts whole). Bytes are known only for rows after the progress the
// backlog counts from (PendingBacklog): for an after below it they count
// those rows only. Safe for concurrent use.
func (s *Store) PendingAfter(ctx context.Context, after int64) (Pending, error) {
	if err := s.primeBacklog(ctx); err != nil {
		return Pending{}, err
	}
	return s.meter.pendingAfter(after), nil
}

func (m *backlogMeter) pendingAfter(after int64) Pending {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := sort.Search(len(m.marks), func(i int) bool { return m.marks[i].last > after })
	var bytes int64
	for _, mk := range m.marks[n:] {
		bytes += mk.bytes
	}
	return Pending{Rows: max(m.lastID-after, 0), Bytes: bytes}
}
