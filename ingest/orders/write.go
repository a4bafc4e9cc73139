package orders

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/outboxd/outboxd/outbox"
)

// write stores what the transaction changed, at its commit
// (Tx.BeforeCommit), order by order in key order, so consecutive rows land
// on the same B-tree pages: the compacted orders' old rows of
// orders_events go first, then the events added, the compacted histories
// and the statuses, each in multi-row statements.
func (b *batch) write(ctx context.Context) error {
	keys := make([]orderKey, 0, len(b.orders))
	for k, s := range b.orders {
		if s.events > 0 || s.doneDirty {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareOrderKeys)
	for len(keys) > 0 {
		n := 1
		for n < len(keys) && keys[n].feed == keys[0].feed {
			n++
		}
		if err := b.writeFeed(ctx, keys[0].feed, keys[:n]); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

// writeFeed writes the changed orders keys, all of feed.
func (b *batch) writeFeed(ctx context.Context, feed string, keys []orderKey) error {
	w := writer{tx: b.tx, feed: feed}
	for _, k := range keys {
		if b.orders[k].dropStored {
			w.add(k.id)
		}
	}
	if err := w.flush(ctx, deleteEventsBySize, "delete the compacted orders' events"); err != nil {
		return err
	}
	for _, k := range keys {
		for _, e := range b.orders[k].fresh {
			p := e.Place
			w.add(k.id, p.Epoch, p.Offset, p.Topic, p.Partition, e.Type, formatAt(e.At))
		}
	}
	if err := w.flush(ctx, insertEventsBySize, "store order events"); err != nil {
		return err
	}
	for _, k := range keys {
		if s := b.orders[k]; s.doneDirty {
			w.add(k.id, string(appendHistory(nil, s.done)))
		}
	}
	if err := w.flush(ctx, upsertDoneBySize, "store compacted histories"); err != nil {
		return err
	}
	for _, k := range keys {
		if s := b.orders[k]; s.events > 0 {
			w.add(k.id, string(s.status), formatAt(s.statusAt), s.events)
		}
	}
	return w.flush(ctx, upsertStatusBySize, "store order statuses")
}

// writer gathers the rows of one multi-row statement and runs it a chunk
// at a time.
type writer struct {
	tx   *outbox.Tx
	feed string
	rows [][]any
	args []any
}

// add queues a row of the next flush.
func (w *writer) add(row ...any) { w.rows = append(w.rows, row) }

// flush writes the queued rows with the statements bySize, in chunks of
// at most writeChunk rows binding the feed once.
func (w *writer) flush(ctx context.Context, bySize map[int]string, what string) error {
	rows := w.rows
	w.rows = w.rows[:0]
	for len(rows) > 0 {
		k := outbox.ChunkSize(len(rows), writeChunk)
		w.args = append(w.args[:0], w.feed)
		for _, r := range rows[:k] {
			w.args = append(w.args, r...)
		}
		st, err := w.tx.Stmt(ctx, bySize[k])
		if err != nil {
			return err
		}
		if _, err := st.ExecContext(ctx, w.args...); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		rows = rows[k:]
	}
	clear(w.args)
	return nil
}

// appendHistory appends events as orders_done keeps a history: the JSON
// text SQLite's json_group_array(json_array(topic, partition, epoch,
// src_offset, type, at)) makes of them, byte for byte.
func appendHistory(b []byte, events []Event) []byte {
	b = append(b, '[')
	for i, e := range events {
		if i > 0 {
			b = append(b, ',')
		}
		p := e.Place
		b = append(b, '[')
		b = appendJSONString(b, p.Topic)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(p.Partition), 10)
		b = append(b, ',')
		b = appendJSONString(b, p.Epoch)
		b = append(b, ',')
		b = strconv.AppendInt(b, p.Offset, 10)
		b = append(b, ',')
		b = appendJSONString(b, e.Type)
		b = append(b, ',', '"')
		b = appendAt(b, e.At) // digits, '-', ':', '.', 'T' and 'Z' need no escape
		b = append(b, '"', ']')
	}
	return append(b, ']')
}

// appendJSONString appends s quoted as SQLite's JSON functions quote text:
// '"' and '\' escaped, the control characters below 0x20 as \b, \t, \n,
// \f, \r or \u00xx, every other byte as it is (even one that is not
// UTF-8).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20:
			b = append(b, c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	return append(b, '"')
}
