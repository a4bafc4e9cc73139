package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// Row is one stored output, as the relay publishes it.
type Row struct {
	ID        int64  `db:"id"`
	Feed      string `db:"feed"`
	Partition int32  `db:"partition"`
	Epoch     string `db:"epoch"`
	Position  int64  `db:"position"`
	N         int    `db:"n"`
	Topic     string `db:"topic"`
	Key       []byte `db:"key"`
	Value     []byte `db:"value"`
	Headers   []byte `db:"headers"`    // EncodeHeaders form
	CreatedAt int64  `db:"created_at"` // unix nanoseconds of the commit that wrote it
}

// Rows returns up to limit rows with id > after, in id order. It reads
// through the read-only pool, so it never waits for the ingest writer. A key
// or value stored empty comes back empty, not nil.
func (s *Store) Rows(ctx context.Context, after int64, limit int) ([]Row, error) {
	return s.RelayRows(ctx, after, limit)
}

// LastOutboxID is the largest outbox id ever assigned (0 for none), pruned
// rows included: a relay progress above it means the database went back in
// time.
func (s *Store) LastOutboxID(ctx context.Context) (int64, error) {
	return lastOutboxID(ctx, s.rdb)
}

func lastOutboxID(ctx context.Context, q sqlx.QueryerContext) (int64, error) {
	var id int64
	if err := sqlx.GetContext(ctx, q, &id, lastIDSQL); err != nil {
		return 0, fmt.Errorf("read last outbox id: %w", err)
	}
	return id, nil
}

// RelayProgress returns the last outbox id the relay relayID recorded as
// published (0 if none).
func (s *Store) RelayProgress(ctx context.Context, relayID string) (int64, error) {
	var id int64
	err := s.db.GetContext(ctx, &id, `SELECT last_id FROM relay_progress WHERE relay_id = ?`, relayID)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read relay progress of %s: %w", relayID, err)
	}
	return id, nil
}

const setRelayProgressSQL = `INSERT INTO relay_progress (relay_id, last_id, updated_at) VALUES (?, ?, ?)
ON CONFLICT(relay_id) DO UPDATE SET last_id = max(last_id, excluded.last_id), updated_at = excluded.updated_at`

// SetRelayProgress records that every row up to lastID is published. The
// stored progress never moves back.
func (s *Store) SetRelayProgress(ctx context.Context, relayID string, lastID int64) error {
	st, err := s.prepared(ctx, setRelayProgressSQL)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(ctx, relayID, lastID, s.Now().UnixNano())
	s.noteWrite(err)
	if err != nil {
		return fmt.Errorf("store relay progress of %s: %w", relayID, err)
	}
	s.relayStored(lastID)
	return nil
}

const feedBacklogSQL = `SELECT coalesce(sum(min(count, last_id - ?1)), 0) AS pending,
coalesce(min(created_at), 0) AS oldest_at
FROM outbox_chunks WHERE last_id > ?1 AND last_id <= ?2 AND feed = ?3`

// pruneChunk bounds each delete (in chunks of outputs) so that pruning a
// large backlog never holds the write lock for long.
const pruneChunk = 1000

// Prune deletes published outputs (id <= through) created before cutoff, a
// chunk of them at a time, oldest first, and returns how many it deleted. A
// chunk goes once its last output is published. Outputs are created in id
// order, so it stops at the first delete holding a chunk too young to go:
// a pass costs one delete, however many outputs are kept.
func (s *Store) Prune(ctx context.Context, through int64, cutoff time.Time) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		var counts []int64
		err := s.db.SelectContext(ctx, &counts, `DELETE FROM outbox_chunks WHERE last_id IN
(SELECT last_id FROM outbox_chunks WHERE last_id <= ? ORDER BY last_id LIMIT ?) AND created_at < ? RETURNING count`,
			through, pruneChunk, cutoff.UnixNano())
		if err != nil {
			return total, fmt.Errorf("prune outbox: %w", err)
		}
		for _, n := range counts {
			total += n
		}
		if len(counts) < pruneChunk {
			break
		}
	}
	return total, nil
}

// Backlog is how many rows wait to be published and since when.
type Backlog struct {
	Pending int64 `db:"pending"`
	// OldestAt is the oldest pending row's creation time in unix
	// nanoseconds, 0 when nothing is pending.
	OldestAt int64 `db:"oldest_at"`
}

// Backlog counts the rows after id after, of one feed, or of all when feed
// is "". For all feeds it costs two lookups by id, not a scan: committed
// ids have no gaps (a rolled-back transaction gives its ids back), so the
// count is the last id minus after. For one feed it reads the pending
// chunks' heads (there is no index by feed: it would cost every chunk
// written), so a scan that took long is reused for a while (see
// feedBacklogs).
func (s *Store) Backlog(ctx context.Context, feed string, after int64) (Backlog, error) {
	return s.backlog(ctx, s.rdb, feed, after)
}

const backlogSQL = `SELECT
max((SELECT last_id FROM outbox_ids) - ?, 0) AS pending,
coalesce((SELECT created_at FROM outbox_chunks WHERE last_id > ? ORDER BY last_id LIMIT 1), 0) AS oldest_at`

// backlog is Backlog read through q: the read-only pool, or a read
// transaction whose snapshot it then shares.
func (s *Store) backlog(ctx context.Context, q sqlx.QueryerContext, feed string, after int64) (Backlog, error) {
	var b Backlog
	if feed != "" {
		return s.feedBacklog(ctx, q, feed, after)
	}
	err := sqlx.GetContext(ctx, q, &b, backlogSQL, after, after)
	if err != nil {
		return b, fmt.Errorf("read outbox backlog: %w", err)
	}
	return b, nil
}

// feedBacklogs remembers each feed's last backlog scan. A scan costs
// reading every pending row: little while the relay keeps up, much while
// Kafka is away and rows pile up, just when an operator watches the
// status. A result is reused as is while the outbox has not changed (it
// is exact), and after a scan of at least scanReuseRows rows that took
// longer than scanReuseAbove for ten times that scan's duration, at most
// scanReuseMax: repeated status requests spend at most about a tenth of a
// core on scans. A scan of fewer rows is never reused, however long it
// took: on a loaded machine a few hundred rows can take 20 ms of wall
// time, and their count is cheap and must be the snapshot's.
type feedBacklogs struct {
	mu    sync.Mutex
	scans map[string]feedScan
}

type feedScan struct {
	after, last int64 // the scan counted the feed's rows in (after, last]
	result      Backlog
	at          time.Time
	took        time.Duration
}

const (
	scanReuseAbove = 20 * time.Millisecond
	scanReuseRows  = 10_000
	scanReuseMax   = 5 * time.Second
)

func (s *Store) feedBacklog(ctx context.Context, q sqlx.QueryerContext, feed string, after int64) (Backlog, error) {
	last, err := lastOutboxID(ctx, q)
	if err != nil {
		return Backlog{}, err
	}
	if last <= after {
		return Backlog{}, nil
	}
	c := &s.backlogs
	c.mu.Lock()
	prev, ok := c.scans[feed]
	c.mu.Unlock()
	now := time.Now()
	if ok && ((prev.after == after && prev.last == last) ||
		(prev.last-prev.after >= scanReuseRows && prev.took > scanReuseAbove &&
			now.Sub(prev.at) < min(10*prev.took, scanReuseMax))) {
		return prev.result, nil
	}
	var b Backlog
	// Rows after last are left out, so the result is exactly that of
	// (after, last], whatever commits meanwhile; of the chunk holding
	// after, only its outputs past it count.
	err = sqlx.GetContext(ctx, q, &b, feedBacklogSQL, after, last, feed)
	if err != nil {
		return b, fmt.Errorf("read outbox backlog of %s: %w", feed, err)
	}
	c.mu.Lock()
	if c.scans == nil {
		c.scans = map[string]feedScan{}
	}
	c.scans[feed] = feedScan{after: after, last: last, result: b, at: now, took: time.Since(now)}
	c.mu.Unlock()
	return b, nil
}
