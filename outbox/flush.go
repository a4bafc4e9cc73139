package outbox

import (
	"database/sql/driver"
	"fmt"
	"strings"
)

// outboxColumns is the number of values one outbox row binds.
const outboxColumns = 10

// flushChunk is the most rows one INSERT writes: fewer statements per
// batch, well under SQLite's limit of bound variables.
const flushChunk = 64

// insertRows is an INSERT of n outbox rows, each binding all its columns.
func insertRows(n int) string {
	return "INSERT INTO outbox (feed, partition, epoch, position, n, topic, key, value, headers, created_at) VALUES " +
		Placeholders(n, outboxColumns)
}

// sharedColumns is the number of values an INSERT from insertRowsShared
// binds once for all its rows: feed, partition, epoch, topic, created_at.
const sharedColumns = 5

// ownColumns is the number of values each of its rows binds: position, n,
// key, value, headers.
const ownColumns = outboxColumns - sharedColumns

// insertRowsShared is an INSERT of n outbox rows of one feed, partition,
// epoch and topic, the common case: those and the commit time are bound
// once, so each row binds half the values. (Numbered parameters would say
// it more directly, but the driver looks each one up by name, in time
// growing with their number.)
func insertRowsShared(n int) string {
	return "INSERT INTO outbox (feed, partition, epoch, position, n, topic, key, value, headers, created_at) " +
		"SELECT ?, ?, ?, column1, column2, ?, column3, column4, column5, ? FROM (VALUES " +
		Placeholders(n, ownColumns) + ")"
}

// Statement texts by chunk size, built once: a chunk is flushChunk rows or
// a power of two below it, so every batch uses the same few statements and
// the store keeps them prepared (see Tx.stmt).
var (
	insertBySize       = map[int]string{}
	insertSharedBySize = map[int]string{}
)

func init() {
	for n := flushChunk; n >= 1; n /= 2 {
		insertBySize[n] = insertRows(n)
		insertSharedBySize[n] = insertRowsShared(n)
	}
}

// ChunkSize is how many of n pending values the next multi-row statement
// takes: max when there are that many, else the largest power of two not
// above n. Statements of a few fixed sizes stay prepared across
// transactions, where one per remainder would be parsed again each time.
// max must be a power of two.
func ChunkSize(n, max int) int {
	if n >= max {
		return max
	}
	k := 1
	for k*2 <= n {
		k *= 2
	}
	return k
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
	tx.committing = true
	defer func() { tx.committing = false }()
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

// flushRows writes the pending outputs in emit order, in chunks of
// ChunkSize rows; a chunk whose rows share their feed, partition, epoch and
// topic binds those once. The statements run on the driver's connection,
// with arguments built straight into the driver's form: through
// database/sql, converting and checking each of a chunk's hundreds of
// arguments again cost about a tenth of the flush.
func (tx *Tx) flushRows() error {
	if len(tx.rows) == 0 {
		return nil
	}
	now := tx.store.Now().UnixNano()
	return tx.conn.Raw(func(dc any) error {
		for rows := tx.rows; len(rows) > 0; {
			k := ChunkSize(len(rows), flushChunk)
			if err := tx.flushChunk(dc, rows[:k], now); err != nil {
				return err
			}
			rows = rows[k:]
		}
		return nil
	})
}

// flushChunk writes one chunk of rows in one INSERT on the driver
// connection dc, and sets their ids.
func (tx *Tx) flushChunk(dc any, chunk []Row, now int64) error {
	args := tx.store.flushArgs[:0]
	defer func() { clear(args); tx.store.flushArgs = args[:0] }() // hold no row's bytes
	var query string
	if first := &chunk[0]; sharesOrigin(chunk) {
		query = insertSharedBySize[len(chunk)]
		args = appendValues(args, first.Feed, int64(first.Partition), first.Epoch, first.Topic, now)
		for i := range chunk {
			r := &chunk[i]
			args = appendValues(args, r.Position, int64(r.N), driverBytes(r.Key), driverBytes(r.Value), driverBytes(r.Headers))
		}
	} else {
		query = insertBySize[len(chunk)]
		for i := range chunk {
			r := &chunk[i]
			args = appendValues(args, r.Feed, int64(r.Partition), r.Epoch, r.Position, int64(r.N),
				r.Topic, driverBytes(r.Key), driverBytes(r.Value), driverBytes(r.Headers), now)
		}
	}
	st, err := tx.store.ownDriverStmt(dc, query)
	if err != nil {
		return err
	}
	res, err := st.ExecContext(tx.ctx, args)
	if err != nil {
		return fmt.Errorf("insert outbox rows: %w", err)
	}
	tx.remember(res, chunk, now)
	for i := range chunk {
		tx.rowBytes += chunk[i].bytes()
	}
	return nil
}

// appendValues appends vs as the next ordinals of a statement's arguments.
func appendValues(args []driver.NamedValue, vs ...driver.Value) []driver.NamedValue {
	for _, v := range vs {
		args = append(args, driver.NamedValue{Ordinal: len(args) + 1, Value: v})
	}
	return args
}

// driverBytes is b as a driver value: NULL for nil, as database/sql binds
// a nil slice, and a BLOB otherwise, an empty one included.
func driverBytes(b []byte) driver.Value {
	if b == nil {
		return nil
	}
	return b
}

// remember sets a written chunk's ids and creation time, for the store's
// cache of recent rows (see RecentRows). A chunk's ids are consecutive
// (AUTOINCREMENT, one statement), ending with the last insert id; should
// they not follow the previous chunk's, nothing of the transaction is
// cached and the relay reads its rows from SQLite.
func (tx *Tx) remember(res driver.Result, chunk []Row, createdAt int64) {
	last, err := res.LastInsertId()
	first := last - int64(len(chunk)) + 1
	if prev := tx.lastID; err != nil || (prev != 0 && prev+1 != first) {
		tx.forget = true
	}
	tx.lastID = last
	for i := range chunk {
		chunk[i].ID, chunk[i].CreatedAt = first+int64(i), createdAt
	}
}

// sharesOrigin reports whether every row has the first one's feed,
// partition, epoch and topic.
func sharesOrigin(rows []Row) bool {
	f := &rows[0]
	for i := range rows[1:] {
		r := &rows[i+1]
		if r.Feed != f.Feed || r.Partition != f.Partition || r.Epoch != f.Epoch || r.Topic != f.Topic {
			return false
		}
	}
	return true
}
