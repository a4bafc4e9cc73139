package orders

import (
	"bytes"
	"strings"
	"unicode/utf8"

	"github.com/outboxd/outboxd/outbox"
)

// The processor's SQL on a PostgreSQL store (outbox.PostgresText): the
// same tables without SQLite's STRICT and WITHOUT ROWID (INTEGER is
// BIGINT), a compacted history's events through json_array_elements in
// their array's order, and the multi-row writes with each VALUES column
// typed (PostgreSQL types a parameter there as text unless told), the
// VALUES list named, and the existing row named by its table in an
// upsert.
const pgSchema = `
CREATE TABLE IF NOT EXISTS orders_events (
    feed       TEXT NOT NULL,
    order_id   TEXT NOT NULL,
    epoch      TEXT NOT NULL,
    src_offset BIGINT NOT NULL,
    topic      TEXT NOT NULL,
    partition  BIGINT NOT NULL,
    type       TEXT NOT NULL,
    at         TEXT NOT NULL,
    PRIMARY KEY (feed, order_id, epoch, src_offset)
);
CREATE UNIQUE INDEX IF NOT EXISTS orders_events_place ON orders_events (feed, epoch, src_offset);
CREATE TABLE IF NOT EXISTS orders_done (
    feed     TEXT NOT NULL,
    order_id TEXT NOT NULL,
    history  TEXT NOT NULL,
    PRIMARY KEY (feed, order_id)
);
CREATE TABLE IF NOT EXISTS orders_status (
    feed     TEXT NOT NULL,
    order_id TEXT NOT NULL,
    status   TEXT NOT NULL,
    at       TEXT NOT NULL,
    events   BIGINT NOT NULL,
    PRIMARY KEY (feed, order_id)
);
`

const pgSelectDone = `SELECT d.order_id, e.value ->> 0, (e.value ->> 1)::bigint, e.value ->> 2, (e.value ->> 3)::bigint,
e.value ->> 4, e.value ->> 5
FROM orders_done AS d, json_array_elements(d.history::json) WITH ORDINALITY AS e(value, i)
WHERE d.feed = ? AND d.order_id = ? ORDER BY d.order_id, e.i`

// pgValues is n rows of typed placeholders named v(column1, ...).
func pgValues(n int, types ...string) string {
	g := make([]string, len(types))
	cols := make([]string, len(types))
	for i, t := range types {
		g[i] = "?::" + t
		cols[i] = "column" + string(rune('1'+i))
	}
	group := "(" + strings.Join(g, ",") + ")"
	return "(VALUES " + strings.TrimSuffix(strings.Repeat(group+",", n), ",") + ") AS v(" + strings.Join(cols, ", ") + ")"
}

// registerPostgres declares the PostgreSQL texts; store.go's init calls
// it once the statements by size are made.
func registerPostgres() {
	outbox.PostgresText(schema, pgSchema)
	outbox.PostgresText(selectDone, pgSelectDone)
	in := func(n int) string { return "(" + strings.Repeat("?,", n-1) + "?)" }
	for n := readChunk; n >= 1; n /= 2 {
		outbox.PostgresText(selectDoneBySize[n], strings.Replace(pgSelectDone, "d.order_id = ?", "d.order_id IN "+in(n), 1))
	}
	for n := writeChunk; n >= 1; n /= 2 {
		outbox.PostgresText(insertEventsBySize[n], "INSERT INTO orders_events (feed, order_id, epoch, src_offset, topic, partition, type, at) "+
			"SELECT ?::text, column1, column2, column3, column4, column5, column6, column7 FROM "+
			pgValues(n, "text", "text", "bigint", "text", "bigint", "text", "text"))
		outbox.PostgresText(upsertDoneBySize[n], "INSERT INTO orders_done (feed, order_id, history) "+
			"SELECT ?::text, column1, column2 FROM "+pgValues(n, "text", "text")+
			" ON CONFLICT(feed, order_id) DO UPDATE SET history = excluded.history")
		outbox.PostgresText(upsertStatusBySize[n], "INSERT INTO orders_status (feed, order_id, status, at, events) "+
			"SELECT ?::text, column1, column2, column3, column4 FROM "+pgValues(n, "text", "text", "text", "bigint")+
			" ON CONFLICT(feed, order_id) DO UPDATE SET status = excluded.status, at = excluded.at, events = orders_status.events + excluded.events")
	}
}

// pgKey reports whether key can be an order id on PostgreSQL, whose text
// is UTF-8 without NUL: another key is dead-lettered as malformed there.
func pgKey(key []byte) bool { return utf8.Valid(key) && bytes.IndexByte(key, 0) < 0 }
