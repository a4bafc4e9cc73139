package outbox

import (
	"container/heap"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"
)

// This file holds the reads a comparison of two databases makes (a replay
// against the live database): outputs in place order, and the rows of the
// processors' state tables.

// Cursor walks rows a query returns. It is not safe for concurrent use;
// Close it when done.
type Cursor[T any] struct {
	rows *sqlx.Rows
	what string
	scan func(*sqlx.Rows) (T, error)
	// pull, when set, makes the rows of the query into the cursor's own:
	// the next one, false at the end.
	pull func() (T, bool, error)
	err  error
	// release, when set, gives back the connection the query runs on.
	release func() error
}

// Next returns the next row; false at the end or on an error (see Err).
func (c *Cursor[T]) Next() (T, bool) {
	var zero T
	if c.err != nil {
		return zero, false
	}
	if c.pull != nil {
		v, ok, err := c.pull()
		if err != nil {
			c.err = fmt.Errorf("read %s: %w", c.what, err)
			return zero, false
		}
		return v, ok
	}
	if !c.rows.Next() {
		return zero, false
	}
	v, err := c.scan(c.rows)
	if err != nil {
		c.err = fmt.Errorf("read %s: %w", c.what, err)
		return zero, false
	}
	return v, true
}

// Err is the error that ended the walk, nil at its end.
func (c *Cursor[T]) Err() error {
	if c.err != nil {
		return c.err
	}
	if err := c.rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", c.what, err)
	}
	return nil
}

// Close releases the query.
func (c *Cursor[T]) Close() error {
	err := c.rows.Close()
	if c.release != nil {
		if rerr := c.release(); err == nil {
			err = rerr
		}
		c.release = nil
	}
	return err
}

// OutputsByPlace walks every outbox row of feed, ordered by partition,
// epoch, position and id, through the read-only pool. A key or value
// stored empty comes back empty, not nil.
//
// No index orders the outbox by place (one would cost every chunk written
// a second B-tree insert), so SQLite sorts the feed's chunks by their
// least place: on a connection of its own whose temporary store is a file,
// so that the sort spills to disk past the connection's page cache instead
// of holding the whole outbox in memory. The outputs of the chunks whose
// places overlap are merged in memory (see placeMerge): a few chunks' at a
// time, since a feed's outputs come in place order.
func (s *Store) OutputsByPlace(ctx context.Context, feed string) (*Cursor[Row], error) {
	conn, restore, err := s.fileSortConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the outputs of %s: %w", feed, err)
	}
	rows, err := conn.QueryxContext(ctx, `SELECT last_id, count, feed, partition, epoch, topic, created_at, body, position
FROM outbox_chunks WHERE feed = ? ORDER BY partition, epoch, position, last_id`, feed)
	if err != nil {
		restore()
		return nil, fmt.Errorf("read the outputs of %s: %w", feed, err)
	}
	m := &placeMerge{rows: rows}
	return &Cursor[Row]{rows: rows, what: "the outputs of " + feed, pull: m.nextRow, release: restore}, nil
}

// placeMerge turns chunks in order of their least place (partition, epoch,
// least position) into outputs in place order: it holds the outputs of
// the chunks read so far that are not yet returned, in a heap, and reads
// the next chunk before returning an output unless that chunk's least
// place is above the output's (so are all its outputs, and every later
// chunk's).
type placeMerge struct {
	rows *sqlx.Rows
	heap placeHeap
	next *pendingChunk // read, its outputs not yet in the heap
	done bool
}

type pendingChunk struct {
	head     chunkHead
	body     []byte
	position int64
}

func (m *placeMerge) read() error {
	m.next = nil
	if m.done {
		return nil
	}
	if !m.rows.Next() {
		m.done = true
		return m.rows.Err()
	}
	var c pendingChunk
	var count int64
	if err := m.rows.Scan(&c.head.lastID, &count, &c.head.feed, &c.head.partition, &c.head.epoch, &c.head.topic,
		&c.head.createdAt, &c.body, &c.position); err != nil {
		return err
	}
	c.head.count = int(count)
	m.next = &c
	return nil
}

func (m *placeMerge) nextRow() (Row, bool, error) {
	if m.next == nil && !m.done {
		if err := m.read(); err != nil {
			return Row{}, false, err
		}
	}
	for m.next != nil && (len(m.heap) == 0 || !placeBelow(m.heap[0], m.next)) {
		rows, err := appendChunkRows(nil, &m.next.head, m.next.body, 0, m.next.head.count)
		if err != nil {
			return Row{}, false, err
		}
		for _, r := range rows {
			heap.Push(&m.heap, r)
		}
		if err := m.read(); err != nil {
			return Row{}, false, err
		}
	}
	if len(m.heap) == 0 {
		return Row{}, false, nil
	}
	return heap.Pop(&m.heap).(Row), true, nil
}

// placeBelow reports whether r's place is below every output of c.
func placeBelow(r Row, c *pendingChunk) bool {
	if r.Partition != c.head.partition {
		return r.Partition < c.head.partition
	}
	if r.Epoch != c.head.epoch {
		return r.Epoch < c.head.epoch
	}
	return r.Position < c.position
}

// placeHeap orders outputs by partition, epoch, position and id.
type placeHeap []Row

func (h placeHeap) Len() int      { return len(h) }
func (h placeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h placeHeap) Less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.Partition != b.Partition {
		return a.Partition < b.Partition
	}
	if a.Epoch != b.Epoch {
		return a.Epoch < b.Epoch
	}
	if a.Position != b.Position {
		return a.Position < b.Position
	}
	return a.ID < b.ID
}
func (h *placeHeap) Push(x any) { *h = append(*h, x.(Row)) }
func (h *placeHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	*h = old[:len(old)-1]
	return r
}

// fileSortConn takes a connection of the read pool and makes its
// temporary store a file; restore sets it back as it was and returns the
// connection to the pool.
func (s *Store) fileSortConn(ctx context.Context) (*sqlx.Conn, func() error, error) {
	if s.pg {
		return s.pgSortConn(ctx)
	}
	conn, err := s.rdb.Connx(ctx)
	if err != nil {
		return nil, nil, err
	}
	var was int
	if err := conn.GetContext(ctx, &was, "PRAGMA temp_store"); err != nil {
		conn.Close()
		return nil, nil, err
	}
	if _, err := conn.ExecContext(ctx, "PRAGMA temp_store = FILE"); err != nil {
		conn.Close()
		return nil, nil, err
	}
	restore := func() error {
		_, err := conn.ExecContext(context.Background(), fmt.Sprintf("PRAGMA temp_store = %d", was))
		if cerr := conn.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return conn, restore, nil
}

// scannedRow is a Row as read from the outbox view, with whether its key
// and value are set: the driver reads an empty BLOB back as nil, and an
// empty value is not a null one (Kafka takes a null value for a
// tombstone).
type scannedRow struct {
	Row
	KeySet   bool `db:"key_set"`
	ValueSet bool `db:"value_set"`
}

func scanOutput(rows *sqlx.Rows) (Row, error) {
	var r scannedRow
	if err := rows.StructScan(&r); err != nil {
		return Row{}, err
	}
	if r.KeySet && r.Key == nil {
		r.Key = []byte{}
	}
	if r.ValueSet && r.Value == nil {
		r.Value = []byte{}
	}
	return r.Row, nil
}

// OwnTables are outboxd's own tables; every other table (sqlite_* aside)
// is a processor's state. A migration that adds a table adds it here.
var OwnTables = []string{"meta", "feeds", "positions", "outbox", "dead_letters", "losses", "relay_progress",
	"outbox_chunks", "outbox_ids", "outbox_slots", "feed_processors", "sink_progress",
	"processor_migrations", "processor_watermarks", "partition_owners", "leases", "cluster_servers"}

// StateTable is a processor's state table.
type StateTable struct {
	Name    string
	Columns []string
	// Key is the primary key's columns, in key order (every column when
	// the table has none).
	Key []string
	// FeedColumn is set when the table has a column named feed: its rows
	// are per feed.
	FeedColumn bool
}

// StateTables lists the processors' state tables, by name.
func (s *Store) StateTables(ctx context.Context) ([]StateTable, error) {
	names, err := s.stateTableNames(ctx)
	if err != nil {
		return nil, err
	}
	var out []StateTable
	for _, n := range names {
		if slices.Contains(OwnTables, n) {
			continue
		}
		t, err := s.stateTable(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// stateTableNames lists the database's tables but SQLite's own.
func (s *Store) stateTableNames(ctx context.Context) ([]string, error) {
	if s.pg {
		return s.pgStateTableNames(ctx)
	}
	var names []string
	if err := s.rdb.SelectContext(ctx, &names, `SELECT name FROM sqlite_schema
WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name`); err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	return names, nil
}

func (s *Store) stateTable(ctx context.Context, name string) (StateTable, error) {
	if s.pg {
		return s.pgStateTable(ctx, name)
	}
	var cols []struct {
		CID     int     `db:"cid"`
		Name    string  `db:"name"`
		Type    string  `db:"type"`
		NotNull bool    `db:"notnull"`
		Default *string `db:"dflt_value"`
		PK      int     `db:"pk"`
	}
	if err := s.rdb.SelectContext(ctx, &cols, `SELECT * FROM pragma_table_info(?)`, name); err != nil {
		return StateTable{}, fmt.Errorf("read the columns of %s: %w", name, err)
	}
	t := StateTable{Name: name}
	key := map[int]string{}
	for _, c := range cols {
		t.Columns = append(t.Columns, c.Name)
		if c.PK > 0 {
			key[c.PK] = c.Name
		}
		if c.Name == "feed" {
			t.FeedColumn = true
		}
	}
	for i := 1; i <= len(key); i++ {
		t.Key = append(t.Key, key[i])
	}
	if len(t.Key) == 0 {
		t.Key = t.Columns
	}
	return t, nil
}

// quoteIdent quotes an SQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// StateRows walks every row of t (only feed's when it has a feed
// column), ordered by its key as SQLite orders values, each row's values
// in t.Columns order.
func (s *Store) StateRows(ctx context.Context, t StateTable, feed string) (*Cursor[[]any], error) {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = quoteIdent(c)
	}
	order := make([]string, len(t.Key))
	for i, c := range t.Key {
		order[i] = quoteIdent(c)
	}
	q := "SELECT " + strings.Join(cols, ", ") + " FROM " + quoteIdent(t.Name)
	var args []any
	if t.FeedColumn {
		q += " WHERE feed = ?"
		args = append(args, feed)
	}
	q += " ORDER BY " + strings.Join(order, ", ")
	rows, err := s.rdb.QueryxContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t.Name, err)
	}
	return &Cursor[[]any]{rows: rows, what: t.Name, scan: func(r *sqlx.Rows) ([]any, error) { return r.SliceScan() }}, nil
}

// OpenExisting opens the database at path for reading, migrating nothing
// and creating nothing: for tools that look at a database another process
// may be running on. It fails when there is no database at path.
func OpenExisting(ctx context.Context, path string) (*Store, error) {
	cfg := DefaultConfig(path)
	s := &Store{cfg: cfg, stmts: map[string]*sqlx.Stmt{}, committed: make(chan struct{}, 1)}
	s.files.infos = make([]os.FileInfo, len(dbFileSuffixes)) // nothing to watch: it writes nothing
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	var err error
	dsn := "file:" + uriPath.Replace(path) + "?mode=ro&_pragma=busy_timeout(5000)&_pragma=query_only(1)"
	if s.rdb, err = sqlx.Open("sqlite", dsn); err != nil {
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	s.rdb.SetMaxOpenConns(2)
	var version int
	if err := s.rdb.GetContext(ctx, &version, "PRAGMA user_version"); err != nil {
		s.rdb.Close()
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	if version == 0 {
		s.rdb.Close()
		return nil, fmt.Errorf("open %s for reading: not an outboxd database", path)
	}
	s.db = s.rdb // never written: it serves the reads that go through the writer
	return s, nil
}
