package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// reference is the processor as it was when every item ran its own
// statements in its savepoint: what the processor decides and stores must
// not differ from it, whatever the batches, hints and rollbacks.
type reference struct{ p *Processor }

const (
	refSelectApplied = `SELECT count(*) FROM orders_events WHERE feed = ? AND epoch = ? AND src_offset = ?`
	refSelectHistory = `SELECT topic, partition, epoch, src_offset, type, at FROM orders_events
WHERE feed = ? AND order_id = ?
UNION ALL
SELECT e.value ->> 0, e.value ->> 1, e.value ->> 2, e.value ->> 3, e.value ->> 4, e.value ->> 5
FROM orders_done AS d, json_each(d.history) AS e WHERE d.feed = ? AND d.order_id = ?`
	refCompactHistory = `INSERT INTO orders_done (feed, order_id, history)
SELECT ?, ?, json_group_array(json_array(topic, partition, epoch, src_offset, type, at)) FROM (
SELECT topic, partition, epoch, src_offset, type, at FROM orders_events
WHERE feed = ? AND order_id = ?
UNION ALL
SELECT e.value ->> 0, e.value ->> 1, e.value ->> 2, e.value ->> 3, e.value ->> 4, e.value ->> 5
FROM orders_done AS d, json_each(d.history) AS e WHERE d.feed = ? AND d.order_id = ?) WHERE true
ON CONFLICT(feed, order_id) DO UPDATE SET history = excluded.history`
	refDeleteEvents = `DELETE FROM orders_events WHERE feed = ? AND order_id = ?`
	refInsertEvent  = `INSERT INTO orders_events (feed, epoch, src_offset, topic, partition, order_id, type, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	refUpsertStatus = `INSERT INTO orders_status (feed, order_id, status, at, events) VALUES (?, ?, ?, ?, 1)
ON CONFLICT(feed, order_id) DO UPDATE SET status = excluded.status, at = excluded.at, events = events + 1`
)

func (r reference) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	p := r.p
	e, reason, err := Decode(item.Key, item.Value)
	if err != nil {
		return ingest.Permanent(reason, err)
	}
	from, attempt, err := p.origin(d, item)
	if err != nil {
		return err
	}
	e.Place = from
	var n int
	if err := tx.Get(ctx, &n, refSelectApplied, d.Feed, from.Epoch, from.Offset); err != nil || n > 0 {
		return err
	}
	hist, err := refHistory(ctx, tx, d.Feed, e.OrderID)
	if err != nil {
		return err
	}
	if duplicate(hist, e) {
		return nil
	}
	status, changes, err := Fold(hist, e)
	if errors.Is(err, ErrInvalidTransition) {
		return p.refused(ctx, tx, item, e, attempt, err)
	}
	if err != nil {
		return err
	}
	pl := e.Place
	if _, err := tx.Exec(ctx, refInsertEvent, d.Feed, pl.Epoch, pl.Offset, pl.Topic, pl.Partition, e.OrderID, e.Type, formatAt(e.At)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, refUpsertStatus, d.Feed, e.OrderID, string(status), formatAt(changes[len(changes)-1].At)); err != nil {
		return err
	}
	if finished(status) {
		if _, err := tx.Exec(ctx, refCompactHistory, d.Feed, e.OrderID, d.Feed, e.OrderID, d.Feed, e.OrderID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, refDeleteEvents, d.Feed, e.OrderID); err != nil {
			return err
		}
	}
	return p.emit(ctx, tx, e.OrderID, item.Key, changes)
}

func refHistory(ctx context.Context, tx *outbox.Tx, feed, orderID string) ([]Event, error) {
	var rows []struct {
		Topic     string `db:"topic"`
		Partition int32  `db:"partition"`
		Epoch     string `db:"epoch"`
		Offset    int64  `db:"src_offset"`
		Type      string `db:"type"`
		At        string `db:"at"`
	}
	if err := tx.Select(ctx, &rows, refSelectHistory, feed, orderID, feed, orderID); err != nil {
		return nil, err
	}
	events := make([]Event, len(rows))
	for i, r := range rows {
		at, err := time.Parse(time.RFC3339Nano, r.At)
		if err != nil {
			return nil, fmt.Errorf("stored time %q: %w", r.At, err)
		}
		events[i] = Event{OrderID: orderID, Type: r.Type, At: at,
			Place: Place{Topic: r.Topic, Partition: r.Partition, Epoch: r.Epoch, Offset: r.Offset}}
	}
	return events, nil
}
