package orders

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// schema is the processor's state, created by Setup. Events are stored by
// order (the key an event's fold reads them by) and unique by their
// original place, so one that comes back (through the retry topic, or
// redelivered) is stored once. Times are RFC 3339 in UTC with all nine
// digits of nanoseconds, so they sort as text.
//
// A finished order (delivered or cancelled) is compacted: its events move
// from orders_events, a row each plus an index entry by place, to one row
// of orders_done holding them all. The tables an open order's events are
// looked up in then hold only the open orders, however many finished ones
// the feed has seen. The compacted history is read back whole, so a late
// event still folds into it, and an event that comes back is still found:
// by place while its order is open, as a duplicate (same type and time)
// once it is finished.
const schema = `
CREATE TABLE IF NOT EXISTS orders_events (
    feed       TEXT NOT NULL,
    order_id   TEXT NOT NULL,
    epoch      TEXT NOT NULL,    -- the original place: the feed epoch
    src_offset INTEGER NOT NULL, -- and the Kafka offset
    topic      TEXT NOT NULL,
    partition  INTEGER NOT NULL,
    type       TEXT NOT NULL,
    at         TEXT NOT NULL,
    PRIMARY KEY (feed, order_id, epoch, src_offset)
) STRICT, WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS orders_events_place ON orders_events (feed, epoch, src_offset);
CREATE TABLE IF NOT EXISTS orders_done (
    feed     TEXT NOT NULL,
    order_id TEXT NOT NULL,
    history  TEXT NOT NULL, -- JSON: [[topic, partition, epoch, src_offset, type, at], ...]
    PRIMARY KEY (feed, order_id)
) STRICT, WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS orders_status (
    feed     TEXT NOT NULL,
    order_id TEXT NOT NULL,
    status   TEXT NOT NULL,
    at       TEXT NOT NULL, -- of the event that set the status (the latest)
    events   INTEGER NOT NULL,
    PRIMARY KEY (feed, order_id)
) STRICT, WITHOUT ROWID;
`

// The reads. An order's open events come in primary-key order, its
// compacted ones in the order of its history's array: the order the
// processor has always folded them in.
const (
	// selectPlace finds the order of the open event first read at a place.
	selectPlace = `SELECT order_id FROM orders_events WHERE feed = ? AND epoch = ? AND src_offset = ?`
	// selectLastOffset is the highest offset of an epoch's open events:
	// an event read after it cannot be stored yet.
	selectLastOffset = `SELECT max(src_offset) FROM orders_events WHERE feed = ? AND epoch = ?`
	selectOpen       = `SELECT order_id, topic, partition, epoch, src_offset, type, at FROM orders_events
WHERE feed = ? AND order_id = ?`
	selectDone = `SELECT d.order_id, e.value ->> 0, e.value ->> 1, e.value ->> 2, e.value ->> 3, e.value ->> 4, e.value ->> 5
FROM orders_done AS d, json_each(d.history) AS e WHERE d.feed = ? AND d.order_id = ?`
)

// readChunk is the most orders one statement of a batch read takes, and
// writeChunk the most rows one statement of the batch's writes does.
const (
	readChunk  = 256
	writeChunk = 64
)

// The statements by number of orders or rows (the chunk size and the
// powers of two below it): reads of many orders at once, and the
// multi-row writes of a batch, each binding the feed once.
var (
	selectOpenBySize   = map[int]string{}
	selectDoneBySize   = map[int]string{}
	insertEventsBySize = map[int]string{}
	deleteEventsBySize = map[int]string{}
	upsertDoneBySize   = map[int]string{}
	upsertStatusBySize = map[int]string{}
)

func init() {
	in := func(n int) string { return "(" + strings.Repeat("?,", n-1) + "?)" }
	for n := readChunk; n >= 1; n /= 2 {
		selectOpenBySize[n] = strings.Replace(selectOpen, "order_id = ?", "order_id IN "+in(n), 1)
		selectDoneBySize[n] = strings.Replace(selectDone, "d.order_id = ?", "d.order_id IN "+in(n), 1)
	}
	// "WHERE true" tells SQLite's parser the ON starts the upsert, not a
	// join constraint.
	for n := writeChunk; n >= 1; n /= 2 {
		insertEventsBySize[n] = "INSERT INTO orders_events (feed, order_id, epoch, src_offset, topic, partition, type, at) " +
			"SELECT ?, column1, column2, column3, column4, column5, column6, column7 FROM (VALUES " + outbox.Placeholders(n, 7) + ")"
		deleteEventsBySize[n] = "DELETE FROM orders_events WHERE feed = ? AND order_id IN " + in(n)
		upsertDoneBySize[n] = "INSERT INTO orders_done (feed, order_id, history) " +
			"SELECT ?, column1, column2 FROM (VALUES " + outbox.Placeholders(n, 2) + ") WHERE true" +
			" ON CONFLICT(feed, order_id) DO UPDATE SET history = excluded.history"
		upsertStatusBySize[n] = "INSERT INTO orders_status (feed, order_id, status, at, events) " +
			"SELECT ?, column1, column2, column3, column4 FROM (VALUES " + outbox.Placeholders(n, 4) + ") WHERE true" +
			" ON CONFLICT(feed, order_id) DO UPDATE SET status = excluded.status, at = excluded.at, events = events + excluded.events"
	}
	registerPostgres()
}

// atLayout is RFC 3339 with fixed-width nanoseconds.
const atLayout = "2006-01-02T15:04:05.000000000Z07:00"

func formatAt(t time.Time) string { return t.UTC().Format(atLayout) }

func appendAt(b []byte, t time.Time) []byte { return t.UTC().AppendFormat(b, atLayout) }

// placeOrder returns the order whose open event was first read at p, if
// one is stored.
func placeOrder(ctx context.Context, tx *outbox.Tx, feed string, p Place) (string, bool, error) {
	st, err := tx.ReadStmt(ctx, selectPlace)
	if err != nil {
		return "", false, err
	}
	var id string
	err = st.QueryRowContext(ctx, feed, p.Epoch, p.Offset).Scan(&id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("look up event at %s offset %d: %w", p.Epoch, p.Offset, err)
	}
	return id, true, nil
}

// lastOffset returns the highest offset of epoch's open events stored, -1
// when there is none.
func lastOffset(ctx context.Context, tx *outbox.Tx, feed, epoch string) (int64, error) {
	st, err := tx.ReadStmt(ctx, selectLastOffset)
	if err != nil {
		return 0, err
	}
	var last sql.NullInt64
	if err := st.QueryRowContext(ctx, feed, epoch).Scan(&last); err != nil {
		return 0, fmt.Errorf("read the last event of %s: %w", epoch, err)
	}
	if !last.Valid {
		return -1, nil
	}
	return last.Int64, nil
}

// readHistories reads the stored events of the orders ids of feed (each
// once, in key order) into states, in statements of at most readChunk
// orders: each order gets its open and compacted events, and every one,
// stored or not, a state. An order whose id SQLite gives back otherwise
// than it was bound gets none (nor do the others of its statement): Apply
// then reads each of them alone.
func readHistories(ctx context.Context, tx *outbox.Tx, feed string, ids []string, states map[orderKey]*orderState) error {
	args := make([]any, 0, 1+min(len(ids), readChunk))
	for len(ids) > 0 {
		k := outbox.ChunkSize(len(ids), readChunk)
		chunk := ids[:k]
		ids = ids[k:]
		args = append(args[:0], feed)
		for _, id := range chunk {
			states[orderKey{feed, id}] = &orderState{}
			args = append(args, id)
		}
		strayOpen, err := readEvents(ctx, tx, selectOpenBySize[k], args, feed, states, nil, false)
		if err != nil {
			return err
		}
		strayDone, err := readEvents(ctx, tx, selectDoneBySize[k], args, feed, states, nil, true)
		if err != nil {
			return err
		}
		if strayOpen || strayDone {
			for _, id := range chunk {
				delete(states, orderKey{feed, id})
			}
		}
	}
	return nil
}

// readHistory reads the stored events of one order.
func readHistory(ctx context.Context, tx *outbox.Tx, feed, id string) (*orderState, error) {
	s := &orderState{}
	args := []any{feed, id}
	if _, err := readEvents(ctx, tx, selectOpenBySize[1], args, feed, nil, s, false); err != nil {
		return nil, err
	}
	if _, err := readEvents(ctx, tx, selectDoneBySize[1], args, feed, nil, s, true); err != nil {
		return nil, err
	}
	return s, nil
}

// readEvents runs one read of events (open ones, or compacted ones when
// done) and adds each row to its order's state in states, or to single
// when it is given. It reports a row of no order in states (a stray).
func readEvents(ctx context.Context, tx *outbox.Tx, query string, args []any, feed string,
	states map[orderKey]*orderState, single *orderState, done bool) (stray bool, err error) {
	st, err := tx.ReadStmt(ctx, query)
	if err != nil {
		return false, err
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return false, fmt.Errorf("read order events: %w", err)
	}
	defer rows.Close()
	var at string
	for rows.Next() {
		var e Event
		p := &e.Place
		if err := rows.Scan(&e.OrderID, &p.Topic, &p.Partition, &p.Epoch, &p.Offset, &e.Type, &at); err != nil {
			return false, fmt.Errorf("read order events: %w", err)
		}
		if e.At, err = time.Parse(time.RFC3339Nano, at); err != nil {
			return false, fmt.Errorf("read events of order %s: stored time %q: %w", e.OrderID, at, err)
		}
		s := single
		if s == nil {
			if s = states[orderKey{feed, e.OrderID}]; s == nil {
				stray = true
				continue
			}
		}
		if done {
			s.done = append(s.done, e)
		} else {
			s.stored = append(s.stored, e)
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("read order events: %w", err)
	}
	return stray, nil
}

// Statuses returns every order's status of a feed, by order id, through
// one read transaction of the store.
func Statuses(ctx context.Context, s *outbox.Store, feed string) (map[string]Status, error) {
	var rows []struct {
		OrderID string `db:"order_id"`
		Status  string `db:"status"`
	}
	err := s.View(ctx, func(r *outbox.ReadTx) error {
		return r.Select(ctx, &rows, `SELECT order_id, status FROM orders_status WHERE feed = ?`, feed)
	})
	if err != nil {
		return nil, fmt.Errorf("read order statuses of %s: %w", feed, err)
	}
	m := make(map[string]Status, len(rows))
	for _, r := range rows {
		m[r.OrderID] = Status(r.Status)
	}
	return m, nil
}
