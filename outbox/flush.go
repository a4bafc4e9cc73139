package outbox

import (
	"fmt"
	"strings"
)

// outboxColumns is the number of values one outbox row binds.
const outboxColumns = 10

// flushChunk is how many rows one INSERT writes: fewer statements per batch,
// well under SQLite's limit of bound variables.
const flushChunk = 64

var insertChunk = insertRows(flushChunk)

// insertRows is an INSERT of n outbox rows.
func insertRows(n int) string {
	return "INSERT INTO outbox (feed, partition, epoch, position, n, topic, key, value, headers, created_at) VALUES " +
		Placeholders(n, outboxColumns)
}

// Placeholders returns the VALUES list of a multi-row statement: n groups
// of cols "?" each, "(?,?),(?,?)" for n = cols = 2.
func Placeholders(n, cols int) string {
	group := "(" + strings.Repeat("?,", cols-1) + "?)"
	var b strings.Builder
	b.Grow(n * (len(group) + 1))
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(group)
	}
	return b.String()
}

// prepareCommit runs the BeforeCommit functions, writes the pending
// outputs, and checks this store still owns the database.
func (tx *Tx) prepareCommit() error {
	for _, f := range tx.beforeCommit {
		if err := f(tx.ctx); err != nil {
			return err
		}
	}
	if err := tx.flushRows(); err != nil {
		return err
	}
	return tx.checkOwner()
}

// flushRows writes the pending outputs in emit order, flushChunk rows per
// statement and the rest one statement for all.
func (tx *Tx) flushRows() error {
	rows := tx.rows
	if len(rows) == 0 {
		return nil
	}
	now := tx.store.Now().UnixNano()
	args := make([]any, 0, min(len(rows), flushChunk)*outboxColumns)
	for len(rows) > 0 {
		k := min(len(rows), flushChunk)
		query := insertChunk
		if k < flushChunk {
			query = insertRows(k)
		}
		st, err := tx.stmt(query)
		if err != nil {
			return err
		}
		args = args[:0]
		for _, r := range rows[:k] {
			args = append(args, r.place.Feed, r.place.Partition, r.place.Epoch, r.place.Position, r.n,
				r.topic, r.key, r.value, r.headers, now)
		}
		if _, err := st.ExecContext(tx.ctx, args...); err != nil {
			return fmt.Errorf("insert outbox rows: %w", err)
		}
		rows = rows[k:]
	}
	return nil
}
