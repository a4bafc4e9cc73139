package outbox

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
)

// chunkColumns is the number of values one chunk binds.
const chunkColumns = 10

// chunkInsertMax is the most chunks one INSERT writes: fewer statements
// per batch, well under SQLite's limit of bound variables.
const chunkInsertMax = 16

// insertChunks is an INSERT of n chunks.
func insertChunks(n int) string {
	return "INSERT INTO outbox_chunks (last_id, count, position, feed, partition, epoch, topic, created_at, bytes, body) VALUES " +
		Placeholders(n, chunkColumns)
}

// The statements of the outbox's ids: the largest assigned, read once per
// commit that writes outputs and set at its end.
const (
	lastIDSQL = `SELECT last_id FROM outbox_ids`
	// lastIDInTxSQL is lastIDSQL as a commit reads it (on PostgreSQL it
	// locks the row, see pg_engine.go).
	lastIDInTxSQL = `SELECT last_id FROM outbox_ids /* in the commit */`
	setLastIDSQL  = `UPDATE outbox_ids SET last_id = ?`
)

// insertChunksBySize holds the INSERT texts by chunk count, built once: a
// statement writes chunkInsertMax chunks or a power of two below, so every
// commit uses the same few statements and the store keeps them prepared.
var insertChunksBySize = map[int]string{}

func init() {
	for n := chunkInsertMax; n >= 1; n /= 2 {
		insertChunksBySize[n] = insertChunks(n)
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
		if err := f(txCtx()); err != nil {
			return err
		}
	}
	if err := tx.flushRows(); err != nil {
		return err
	}
	return tx.checkOwner()
}

// chunkSpan is a chunk of a commit's rows: n rows from start, its body at
// body[from:to] of the commit's buffer, its least position, its backlog
// bytes (chunkBytes).
type chunkSpan struct {
	start, n int
	from, to int
	position int64
	bytes    int64
}

// packRows encodes rows from the start'th in chunks, at most most of them,
// appending their bodies to body and their spans to spans, and returns
// the index of the first row left: consecutive rows of one feed,
// partition, epoch and topic make a chunk, at most chunkMaxRows of them
// and chunkMaxBody of body (or one row).
func packRows(rows []Row, start, most int, body []byte, spans []chunkSpan, z *compressor) (int, []byte, []chunkSpan) {
	i := start
	for k := 0; i < len(rows) && k < most; k++ {
		sp := chunkSpan{start: i, from: len(body), position: rows[i].Position}
		first := &rows[i]
		body = append(body, bodyRaw)
		for i < len(rows) && i-sp.start < chunkMaxRows {
			r := &rows[i]
			if i > sp.start && (!sameOrigin(r, first) || len(body)-sp.from-1+outputBytes(r) > chunkMaxBody) {
				break
			}
			body = appendOutput(body, r)
			sp.position = min(sp.position, r.Position)
			i++
		}
		body = z.body(body, sp.from)
		sp.n, sp.to = i-sp.start, len(body)
		sp.bytes = chunkBytes(body[sp.from:], first.Feed, first.Epoch, first.Topic)
		spans = append(spans, sp)
	}
	return i, body, spans
}

// flushRows writes the outputs in emit order, packed in chunks (see
// chunk.go), several chunks an INSERT, and gives them the ids that follow
// the last one assigned. The chunks of one INSERT are encoded in a buffer
// the store keeps (a few chunks' bodies: the driver copies what it binds),
// and the statements run on the driver's connection, with arguments built
// straight into the driver's form.
func (tx *Tx) flushRows() error {
	if len(tx.rows) == 0 {
		return nil
	}
	s := tx.store
	now := s.Now().UnixNano()
	rows := tx.rows
	body, spans := s.flushBody[:0], s.flushSpans[:0]
	defer func() {
		// Keep the buffers for the next commit, unless an output made
		// them large.
		if cap(body) <= keptBodyBytes {
			s.flushBody = body[:0]
		}
		s.flushSpans = spans[:0]
	}()
	return tx.conn.Raw(func(dc any) error {
		last, err := tx.lastOutboxID(dc)
		if err != nil {
			return err
		}
		for next := 0; next < len(rows); {
			// A statement's worth of chunks, or what is left.
			next, body, spans = packRows(rows, next, chunkInsertMax, body[:0], spans[:0], &s.pack)
			for todo := spans; len(todo) > 0; {
				k := ChunkSize(len(todo), chunkInsertMax)
				if err := tx.insertChunks(dc, todo[:k], body, last, now); err != nil {
					return err
				}
				todo = todo[k:]
			}
			for _, sp := range spans {
				tx.rowBytes += sp.bytes
			}
		}
		end := last + int64(len(rows))
		st, err := s.ownDriverStmt(dc, setLastIDSQL)
		if err != nil {
			return err
		}
		if _, err := st.ExecContext(txCtx(), []driver.NamedValue{{Ordinal: 1, Value: end}}); err != nil {
			return fmt.Errorf("store the last outbox id: %w", err)
		}
		for i := range rows {
			rows[i].ID, rows[i].CreatedAt = last+1+int64(i), now
		}
		tx.lastID = end
		return nil
	})
}

// keptBodyBytes bounds the body buffer a store keeps between commits.
const keptBodyBytes = 1 << 20

// lastOutboxID reads the largest id assigned, in the transaction.
func (tx *Tx) lastOutboxID(dc any) (int64, error) {
	st, err := tx.store.ownQueryStmt(dc, lastIDInTxSQL)
	if err != nil {
		return 0, err
	}
	rows, err := st.QueryContext(txCtx(), nil)
	if err != nil {
		return 0, fmt.Errorf("read the last outbox id: %w", err)
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("outbox_ids has no row")
		}
		return 0, fmt.Errorf("read the last outbox id: %w", err)
	}
	id, ok := v[0].(int64)
	if !ok {
		return 0, fmt.Errorf("read the last outbox id: it is a %T", v[0])
	}
	return id, nil
}

// insertChunks writes spans, chunks of the commit whose bodies are in
// body, in one INSERT; last is the id before the commit's first output.
func (tx *Tx) insertChunks(dc any, spans []chunkSpan, body []byte, last, now int64) error {
	args := tx.store.flushArgs[:0]
	defer func() { clear(args); tx.store.flushArgs = args[:0] }() // hold no row's bytes
	for _, sp := range spans {
		r := &tx.rows[sp.start]
		args = appendValues(args, last+int64(sp.start+sp.n), int64(sp.n), sp.position, r.Feed, int64(r.Partition), r.Epoch,
			r.Topic, now, sp.bytes, body[sp.from:sp.to:sp.to])
	}
	st, err := tx.store.ownDriverStmt(dc, insertChunksBySize[len(spans)])
	if err != nil {
		return err
	}
	if _, err := st.ExecContext(txCtx(), args); err != nil {
		return fmt.Errorf("insert outbox rows: %w", err)
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

// sameOrigin reports whether r has o's feed, partition, epoch and topic.
func sameOrigin(r, o *Row) bool {
	return r.Feed == o.Feed && r.Partition == o.Partition && r.Epoch == o.Epoch && r.Topic == o.Topic
}
