package outbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
)

// This file holds what the relay needs beyond the general store API.

// relayRowsQuery reads the relay's rows with as few column reads as it
// can: every column costs the driver a type lookup and a read into
// SQLite, each through the connection's mutex, and every text column a
// Go string of its own. So feed, epoch and topic come back NULL when they
// equal ?3, ?4 and ?5 (those of the row read before, which most rows of a
// batch share), and partition shares a column with which of key and
// value are not NULL (packed as partition<<2 | valueSet<<1 | keySet).
const relayRowsQuery = `SELECT id, nullif(feed, ?3), nullif(epoch, ?4), nullif(topic, ?5), position, n,
key, value, headers, created_at,
(partition << 2) | ((value IS NOT NULL) << 1) | (key IS NOT NULL)
FROM outbox WHERE id > ?1 ORDER BY id LIMIT ?2`

// relayRowColumns is the number of columns relayRowsQuery selects.
const relayRowColumns = 11

// The bits of relayRowsQuery's last column below the partition.
const (
	keySet   = 1
	valueSet = 2
	setBits  = 2
)

// relayText is the feed, epoch and topic relayRowsQuery compares each
// row's with: those of the last row read. A guess, never a fact: a row
// whose text differs brings its own.
type relayText struct {
	mu                 sync.Mutex
	feed, epoch, topic string
}

func (t *relayText) get() (feed, epoch, topic string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.feed, t.epoch, t.topic
}

func (t *relayText) set(r *Row) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.feed, t.epoch, t.topic = r.Feed, r.Epoch, r.Topic
}

// RelayRows returns the same rows as Rows (up to limit rows with id > after,
// in id order, through the read-only pool), read through the SQLite driver
// directly: the driver already hands over fresh copies of the blobs, so
// database/sql's conversion and second copy of every column are skipped,
// and the rows of a batch share one string of each feed, epoch and topic
// they have in common. It is the relay's hot path; Rows stays the general
// reader. Safe for concurrent use.
func (s *Store) RelayRows(ctx context.Context, after int64, limit int) ([]Row, error) {
	conn, err := s.rdb.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows after %d: %w", after, err)
	}
	defer conn.Close()
	rows := make([]Row, 0, limit)
	err = conn.Raw(func(dc any) error {
		rows, err = s.relayRowsOn(ctx, dc, after, limit, rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox rows after %d: %w", after, err)
	}
	if len(rows) > 0 {
		s.relayText.set(&rows[len(rows)-1])
	}
	return rows, nil
}

// relayRowsOn runs relayRowsQuery on the driver connection dc and appends
// its rows to rows.
func (s *Store) relayRowsOn(ctx context.Context, dc any, after int64, limit int, rows []Row) ([]Row, error) {
	q, ok := dc.(driver.QueryerContext)
	if !ok {
		return rows, errors.New("the SQLite driver cannot query directly")
	}
	var t rowTexts
	t.bound.Feed, t.bound.Epoch, t.bound.Topic = s.relayText.get()
	t.last = t.bound
	dr, err := q.QueryContext(ctx, relayRowsQuery, []driver.NamedValue{
		{Ordinal: 1, Value: after}, {Ordinal: 2, Value: int64(limit)},
		{Ordinal: 3, Value: t.bound.Feed}, {Ordinal: 4, Value: t.bound.Epoch}, {Ordinal: 5, Value: t.bound.Topic},
	})
	if err != nil {
		return rows, err
	}
	defer dr.Close()
	vals := make([]driver.Value, relayRowColumns)
	for {
		if err := dr.Next(vals); errors.Is(err, io.EOF) {
			return rows, nil
		} else if err != nil {
			return rows, err
		}
		r, err := rowOf(vals, &t)
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
}

// rowTexts are the texts of a read of relayRowsQuery: bound, those the
// query compared each row's with (a NULL stands for them), and last, the
// last ones a row brought, so that rows alternating between two feeds or
// topics share their strings too.
type rowTexts struct {
	bound, last struct{ Feed, Epoch, Topic string }
	lastID      int64
}

// rowOf converts one driver row of relayRowsQuery.
func rowOf(v []driver.Value, t *rowTexts) (Row, error) {
	var r Row
	var n, packed int64
	ok := intValue(v[0], &r.ID) && intValue(v[4], &r.Position) && intValue(v[5], &n) &&
		intValue(v[9], &r.CreatedAt) && intValue(v[10], &packed)
	if !ok {
		return r, fmt.Errorf("outbox row after %d: an integer column holds %T, %T, %T, %T, %T",
			t.lastID, v[0], v[4], v[5], v[9], v[10])
	}
	r.N, r.Partition = int(n), int32(packed>>setBits)
	r.Feed = sharedText(v[1], t.bound.Feed, &t.last.Feed)
	r.Epoch = sharedText(v[2], t.bound.Epoch, &t.last.Epoch)
	r.Topic = sharedText(v[3], t.bound.Topic, &t.last.Topic)
	r.Key, r.Value, r.Headers = blobValue(v[6]), blobValue(v[7]), blobValue(v[8])
	// The driver reads an empty blob back as nil; an empty key or value is
	// not a null one (Kafka takes a null value for a tombstone).
	if r.Key == nil && packed&keySet != 0 {
		r.Key = []byte{}
	}
	if r.Value == nil && packed&valueSet != 0 {
		r.Value = []byte{}
	}
	t.lastID = r.ID
	return r, nil
}

// sharedText is a text column that relayRowsQuery made NULL when it
// equals bound; one equal to *last is *last, and another becomes *last.
func sharedText(v driver.Value, bound string, last *string) string {
	if v == nil {
		return bound
	}
	if t := textValue(v); t != *last {
		*last = t
	}
	return *last
}

func intValue(v driver.Value, dst *int64) bool {
	i, ok := v.(int64)
	*dst = i
	return ok
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
