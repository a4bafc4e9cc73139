package outbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
)

// This file holds what the relay needs beyond the general store API.

// chunksAfterQuery reads the chunks holding outputs with ids above ?1,
// in id order.
const chunksAfterQuery = `SELECT last_id, count, feed, partition, epoch, topic, created_at, body
FROM outbox_chunks WHERE last_id > ?1 ORDER BY last_id`

// chunkColumnsRead is the number of columns chunksAfterQuery selects.
const chunkColumnsRead = 8

// RelayRows returns the same rows as Rows: up to limit outputs with id >
// after, in id order, through the read-only pool. It is the relay's hot
// path: the chunks are read through the SQLite driver directly, whose
// copy of a body the rows' keys, values and headers share, and the rows
// of a batch share one string of each feed, epoch and topic they have in
// common. Safe for concurrent use.
func (s *Store) RelayRows(ctx context.Context, after int64, limit int) ([]Row, error) {
	conn, err := s.rdb.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows after %d: %w", after, err)
	}
	defer conn.Close()
	rows := make([]Row, 0, min(limit, 1<<16))
	err = conn.Raw(func(dc any) error {
		rows, err = rowsAfterOn(ctx, dc, after, limit, rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox rows after %d: %w", after, err)
	}
	return rows, nil
}

// rowsAfterOn runs chunksAfterQuery on the driver connection dc and
// appends the outputs after id after to rows, until it holds limit.
func rowsAfterOn(ctx context.Context, dc any, after int64, limit int, rows []Row) ([]Row, error) {
	if limit <= 0 {
		return rows, nil
	}
	q, ok := dc.(driver.QueryerContext)
	if !ok {
		return rows, errors.New("the SQLite driver cannot query directly")
	}
	query, args := chunksAfterQuery, []driver.NamedValue{{Ordinal: 1, Value: after}}
	if _, pg := dc.(*pgConn); pg {
		query, args = chunksAfterPGQuery, append(args, driver.NamedValue{Ordinal: 2, Value: int64(limit)})
	}
	dr, err := q.QueryContext(ctx, query, args)
	if err != nil {
		return rows, err
	}
	defer dr.Close()
	vals := make([]driver.Value, chunkColumnsRead)
	var h chunkHead
	want := len(rows) + limit
	for len(rows) < want {
		if err := dr.Next(vals); errors.Is(err, io.EOF) {
			return rows, nil
		} else if err != nil {
			return rows, err
		}
		if err := h.read(vals); err != nil {
			return rows, err
		}
		if rows, err = appendChunkRows(rows, &h, blobValue(vals[7]), after, want-len(rows)); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// read sets h from a row of chunksAfterQuery, keeping its texts where the
// row's are the same (the rows of a run share them).
func (h *chunkHead) read(v []driver.Value) error {
	var count, partition int64
	if !intValue(v[0], &h.lastID) || !intValue(v[1], &count) || !intValue(v[3], &partition) || !intValue(v[6], &h.createdAt) {
		return fmt.Errorf("outbox chunk after id %d: an integer column holds %T, %T, %T, %T",
			h.lastID, v[0], v[1], v[3], v[6])
	}
	if count < 1 || count > chunkMaxRows {
		return fmt.Errorf("outbox chunk ending at id %d: count %d: %w", h.lastID, count, ErrBadChunk)
	}
	h.count, h.partition = int(count), int32(partition)
	keepText(v[2], &h.feed)
	keepText(v[4], &h.epoch)
	keepText(v[5], &h.topic)
	return nil
}

// keepText sets *dst to v's text unless it is that already.
func keepText(v driver.Value, dst *string) {
	switch t := v.(type) {
	case string:
		if t != *dst {
			*dst = t
		}
	case []byte:
		if string(t) != *dst {
			*dst = string(t)
		}
	default:
		*dst = ""
	}
}

func intValue(v driver.Value, dst *int64) bool {
	i, ok := v.(int64)
	*dst = i
	return ok
}

// blobValue is a driver value as bytes, for a row's column and a
// function's argument alike: a BLOB as the driver gave it (its copy,
// kept), a TEXT its bytes; NULL and an empty blob are nil.
func blobValue(v driver.Value) []byte {
	switch t := v.(type) {
	case []byte:
		return t
	case string:
		return []byte(t)
	}
	return nil
}
