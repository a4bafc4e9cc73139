package outbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
)

// This file holds what the relay needs beyond the general store API.

// relayRowsQuery's last column says which of key and value are not NULL
// (keySet | valueSet), in one column: every column read costs the driver
// a few calls into SQLite, each through the connection's mutex.
const relayRowsQuery = `SELECT id, feed, partition, epoch, position, n, topic, key, value, headers, created_at,
(key IS NOT NULL) | ((value IS NOT NULL) << 1)
FROM outbox WHERE id > ? ORDER BY id LIMIT ?`

// relayRowColumns is the number of columns relayRowsQuery selects.
const relayRowColumns = 12

// The bits of relayRowsQuery's last column.
const (
	keySet   = 1
	valueSet = 2
)

// RelayRows returns the same rows as Rows (up to limit rows with id > after,
// in id order, through the read-only pool), read through the SQLite driver
// directly: the driver already hands over fresh copies of the blobs, so
// database/sql's conversion and second copy of every column are skipped.
// It is the relay's hot path; Rows stays the general reader.
func (s *Store) RelayRows(ctx context.Context, after int64, limit int) ([]Row, error) {
	conn, err := s.rdb.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows after %d: %w", after, err)
	}
	defer conn.Close()
	rows := make([]Row, 0, limit)
	err = conn.Raw(func(dc any) error {
		q, ok := dc.(driver.QueryerContext)
		if !ok {
			return errors.New("the SQLite driver cannot query directly")
		}
		dr, err := q.QueryContext(ctx, relayRowsQuery, []driver.NamedValue{
			{Ordinal: 1, Value: after}, {Ordinal: 2, Value: int64(limit)},
		})
		if err != nil {
			return err
		}
		defer dr.Close()
		vals := make([]driver.Value, relayRowColumns)
		for {
			if err := dr.Next(vals); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
			r, err := rowOf(vals)
			if err != nil {
				return err
			}
			rows = append(rows, r)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox rows after %d: %w", after, err)
	}
	return rows, nil
}

// rowOf converts one driver row of relayRowsQuery.
func rowOf(v []driver.Value) (Row, error) {
	var r Row
	var n int64
	var errs []error
	get := func(i int, dst *int64) { errs = append(errs, intValue(v[i], dst)) }
	get(0, &r.ID)
	var part int64
	get(2, &part)
	get(4, &r.Position)
	get(5, &n)
	get(10, &r.CreatedAt)
	r.Partition, r.N = int32(part), int(n)
	r.Feed, r.Epoch, r.Topic = textValue(v[1]), textValue(v[3]), textValue(v[6])
	r.Key, r.Value, r.Headers = blobValue(v[7]), blobValue(v[8]), blobValue(v[9])
	// The driver reads an empty blob back as nil; an empty key or value is
	// not a null one (Kafka takes a null value for a tombstone).
	var set int64
	get(11, &set)
	if r.Key == nil && set&keySet != 0 {
		r.Key = []byte{}
	}
	if r.Value == nil && set&valueSet != 0 {
		r.Value = []byte{}
	}
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("outbox row %d: %w", r.ID, err)
	}
	return r, nil
}

func intValue(v driver.Value, dst *int64) error {
	i, ok := v.(int64)
	if !ok {
		return fmt.Errorf("want an integer, have %T", v)
	}
	*dst = i
	return nil
}

func textValue(v driver.Value) string {
	switch t := v.(type) {
	case string:
		return t
	case []byte:
		return string(t)
	}
	return ""
}

// blobValue keeps the driver's copy; NULL and an empty blob are nil.
func blobValue(v driver.Value) []byte {
	switch t := v.(type) {
	case []byte:
		return t
	case string:
		return []byte(t)
	}
	return nil
}
