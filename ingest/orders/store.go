package orders

import (
	"context"
	"fmt"
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

const (
	selectApplied = `SELECT count(*) FROM orders_events WHERE feed = ? AND epoch = ? AND src_offset = ?`
	// selectHistory binds feed and order twice: the open events, then the
	// compacted ones.
	selectHistory = `SELECT topic, partition, epoch, src_offset, type, at FROM orders_events
WHERE feed = ? AND order_id = ?
UNION ALL
SELECT e.value ->> 0, e.value ->> 1, e.value ->> 2, e.value ->> 3, e.value ->> 4, e.value ->> 5
FROM orders_done AS d, json_each(d.history) AS e WHERE d.feed = ? AND d.order_id = ?`
	// compactHistory folds an order's events, open and compacted, into its
	// row of orders_done (binding feed and order three times); deleteEvents
	// then removes the open ones.
	compactHistory = `INSERT INTO orders_done (feed, order_id, history)
SELECT ?, ?, json_group_array(json_array(topic, partition, epoch, src_offset, type, at)) FROM (
SELECT topic, partition, epoch, src_offset, type, at FROM orders_events
WHERE feed = ? AND order_id = ?
UNION ALL
SELECT e.value ->> 0, e.value ->> 1, e.value ->> 2, e.value ->> 3, e.value ->> 4, e.value ->> 5
FROM orders_done AS d, json_each(d.history) AS e WHERE d.feed = ? AND d.order_id = ?) WHERE true
ON CONFLICT(feed, order_id) DO UPDATE SET history = excluded.history`
	deleteEvents = `DELETE FROM orders_events WHERE feed = ? AND order_id = ?`
	insertEvent  = `INSERT INTO orders_events (feed, epoch, src_offset, topic, partition, order_id, type, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	upsertStatus = `INSERT INTO orders_status (feed, order_id, status, at, events) VALUES (?, ?, ?, ?, 1)
ON CONFLICT(feed, order_id) DO UPDATE SET status = excluded.status, at = excluded.at, events = events + 1`
)

// atLayout is RFC 3339 with fixed-width nanoseconds.
const atLayout = "2006-01-02T15:04:05.000000000Z07:00"

func formatAt(t time.Time) string { return t.UTC().Format(atLayout) }

// applied reports whether the event first read at p is stored.
func applied(ctx context.Context, tx *outbox.Tx, feed string, p Place) (bool, error) {
	st, err := tx.Stmt(ctx, selectApplied)
	if err != nil {
		return false, err
	}
	var n int
	if err := st.GetContext(ctx, &n, feed, p.Epoch, p.Offset); err != nil {
		return false, fmt.Errorf("look up event at %s offset %d: %w", p.Epoch, p.Offset, err)
	}
	return n > 0, nil
}

type eventRow struct {
	Topic     string `db:"topic"`
	Partition int32  `db:"partition"`
	Epoch     string `db:"epoch"`
	Offset    int64  `db:"src_offset"`
	Type      string `db:"type"`
	At        string `db:"at"`
}

// history returns the stored events of an order.
func history(ctx context.Context, tx *outbox.Tx, feed, orderID string) ([]Event, error) {
	st, err := tx.Stmt(ctx, selectHistory)
	if err != nil {
		return nil, err
	}
	var rows []eventRow
	if err := st.SelectContext(ctx, &rows, feed, orderID, feed, orderID); err != nil {
		return nil, fmt.Errorf("read events of order %s: %w", orderID, err)
	}
	events := make([]Event, len(rows))
	for i, r := range rows {
		at, err := time.Parse(time.RFC3339Nano, r.At)
		if err != nil {
			return nil, fmt.Errorf("read events of order %s: stored time %q: %w", orderID, r.At, err)
		}
		events[i] = Event{OrderID: orderID, Type: r.Type, At: at,
			Place: Place{Topic: r.Topic, Partition: r.Partition, Epoch: r.Epoch, Offset: r.Offset}}
	}
	return events, nil
}

// store records e and the order's new status, set by an event at statusAt.
func store(ctx context.Context, tx *outbox.Tx, feed string, e Event, status Status, statusAt time.Time) error {
	ins, err := tx.Stmt(ctx, insertEvent)
	if err != nil {
		return err
	}
	p := e.Place
	if _, err := ins.ExecContext(ctx, feed, p.Epoch, p.Offset, p.Topic, p.Partition, e.OrderID, e.Type, formatAt(e.At)); err != nil {
		return fmt.Errorf("store event of order %s: %w", e.OrderID, err)
	}
	up, err := tx.Stmt(ctx, upsertStatus)
	if err != nil {
		return err
	}
	if _, err := up.ExecContext(ctx, feed, e.OrderID, string(status), formatAt(statusAt)); err != nil {
		return fmt.Errorf("store status of order %s: %w", e.OrderID, err)
	}
	if finished(status) {
		return compact(ctx, tx, feed, e.OrderID)
	}
	return nil
}

// finished reports whether an order in status s is compacted.
func finished(s Status) bool { return s == Delivered || s == Cancelled }

// compact moves a finished order's events into its row of orders_done.
func compact(ctx context.Context, tx *outbox.Tx, feed, orderID string) error {
	st, err := tx.Stmt(ctx, compactHistory)
	if err != nil {
		return err
	}
	if _, err := st.ExecContext(ctx, feed, orderID, feed, orderID, feed, orderID); err != nil {
		return fmt.Errorf("compact the history of order %s: %w", orderID, err)
	}
	del, err := tx.Stmt(ctx, deleteEvents)
	if err != nil {
		return err
	}
	if _, err := del.ExecContext(ctx, feed, orderID); err != nil {
		return fmt.Errorf("compact the history of order %s: %w", orderID, err)
	}
	return nil
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
