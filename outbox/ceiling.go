package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"time"
)

// Ceiling is the engine with nothing of the store around it, for the
// bench's ceilings (server bench: raw_sqlite, raw_pipeline, commit_floor,
// naive_sqlite and the state prefill): one connection opened exactly as
// the store opens its writer (DSN), on a database whose schema the store
// created, running batches built before their timed part with the
// statements the store's Commit runs. It is no way to write a store:
// nothing it writes is checked, fenced or counted. Used by one goroutine.
type Ceiling struct {
	db    *sql.DB
	dc    any                    // the driver connection stmts belong to
	stmts map[string]driver.Stmt // prepared on dc
}

// OpenCeiling creates the database's schema through a store (then closes
// it), opens one connection as the store's writer, and registers feed and
// the owner the store's commit checks.
func OpenCeiling(ctx context.Context, cfg Config, feed string) (*Ceiling, error) {
	s, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Close(); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", DSN(cfg))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", cfg.Path, err)
	}
	db.SetMaxOpenConns(1)
	c := &Ceiling{db: db}
	if _, err := db.ExecContext(ctx, `INSERT INTO feeds (name, kind, processor) VALUES (?, 'file', 'bench')
ON CONFLICT(name) DO NOTHING`, feed); err != nil {
		c.Close()
		return nil, fmt.Errorf("insert feed: %w", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('owner', '1') ON CONFLICT(key) DO NOTHING`); err != nil {
		c.Close()
		return nil, fmt.Errorf("insert owner: %w", err)
	}
	return c, nil
}

// DB is the ceiling's connection through database/sql, for the loops that
// measure what database/sql costs (naive_sqlite) and for writing state
// before a timer.
func (c *Ceiling) DB() *sql.DB { return c.db }

// Close closes the prepared statements (SQLite keeps its files open while
// any is), then the connection.
func (c *Ceiling) Close() error {
	if len(c.stmts) > 0 {
		err := c.onConn(context.Background(), func(dc any) error {
			if dc == c.dc {
				for _, st := range c.stmts {
					st.Close()
				}
			}
			return nil
		})
		c.stmts, c.dc = nil, nil
		if err != nil {
			c.db.Close()
			return fmt.Errorf("close ceiling statements: %w", err)
		}
	}
	if err := c.db.Close(); err != nil {
		return fmt.Errorf("close ceiling database: %w", err)
	}
	return nil
}

// onConn runs fn on the driver connection of the pool's one connection.
func (c *Ceiling) onConn(ctx context.Context, fn func(dc any) error) error {
	conn, err := c.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connection: %w", err)
	}
	defer conn.Close()
	return conn.Raw(fn)
}

// stmt is query prepared on dc, once: a former connection's statements
// went with it (database/sql opens another only once that one is closed).
func (c *Ceiling) stmt(dc any, query string) (driver.Stmt, error) {
	if c.dc != dc {
		c.dc, c.stmts = dc, map[string]driver.Stmt{}
	}
	if st, ok := c.stmts[query]; ok {
		return st, nil
	}
	st, err := prepareDriver(dc, query)
	if err != nil {
		return nil, err
	}
	c.stmts[query] = st
	return st, nil
}

// CeilingStatement is one of a processor's statements in a CeilingBatch:
// its text and its arguments, bound by position.
type CeilingStatement struct {
	Query string
	Args  []any
}

// CeilingBatch is one batch of a ceiling's work, built by NewCeilingBatch
// before the timed part: the processor's reads (their rows read and
// dropped) and writes, the outputs packed as Commit packs them, and the
// feed's position and stats.
type CeilingBatch struct {
	feed, epoch string
	last, lines int64
	reads       []ceilingStmt
	writes      []ceilingStmt
	inserts     [][]driver.NamedValue
	offsets     [][]int64 // per insert, each chunk's last id less the id before the batch
}

type ceilingStmt struct {
	query string
	args  []driver.NamedValue
}

// NewCeilingBatch builds a batch of lines items of feed's epoch, the last
// at position last, with the processor's reads and writes and the outputs
// rows (in emit order).
func NewCeilingBatch(feed, epoch string, lines, last int64, reads, writes []CeilingStatement, rows []Row) *CeilingBatch {
	b := &CeilingBatch{feed: feed, epoch: epoch, lines: lines, last: last,
		reads: ceilingStmts(reads), writes: ceilingStmts(writes)}
	_, body, spans := packRows(rows, 0, len(rows), nil, nil, &compressor{})
	for len(spans) > 0 {
		k := ChunkSize(len(spans), chunkInsertMax)
		var args []driver.NamedValue
		var offs []int64
		for _, sp := range spans[:k] {
			r := &rows[sp.start]
			offs = append(offs, int64(sp.start+sp.n))
			// The last id and the creation time are set in the timed part.
			args = appendValues(args, nil, int64(sp.n), sp.position, r.Feed, int64(r.Partition), r.Epoch, r.Topic,
				nil, sp.bytes, body[sp.from:sp.to:sp.to])
		}
		b.inserts = append(b.inserts, args)
		b.offsets = append(b.offsets, offs)
		spans = spans[k:]
	}
	return b
}

func ceilingStmts(ss []CeilingStatement) []ceilingStmt {
	out := make([]ceilingStmt, len(ss))
	for i, s := range ss {
		out[i] = ceilingStmt{query: s.Query, args: make([]driver.NamedValue, 0, len(s.Args))}
		for _, a := range s.Args {
			out[i].args = appendValues(out[i].args, a)
		}
	}
	return out
}

// Write runs b in one transaction as the store's Commit does, size being
// the feed's source end.
func (c *Ceiling) Write(ctx context.Context, b *CeilingBatch, size int64) error {
	return c.txn(ctx, func(dc any) error { return c.batch(ctx, dc, b, size) })
}

// CommitOnly writes only the feed's position at pos, in a transaction of
// its own: the least a commit that reaches the disk costs.
func (c *Ceiling) CommitOnly(ctx context.Context, feed, epoch string, pos, size int64) error {
	return c.txn(ctx, func(dc any) error {
		return c.exec(ctx, dc, upsertPosition, appendValues(nil, feed, int64(0), epoch, pos, size, time.Now().UnixNano()), "store position")
	})
}

// txn runs fn in one transaction on the driver's connection.
func (c *Ceiling) txn(ctx context.Context, fn func(dc any) error) error {
	return c.onConn(ctx, func(dc any) error {
		bt, ok := dc.(driver.ConnBeginTx)
		if !ok {
			return fmt.Errorf("begin: the SQLite driver's connection is a %T", dc)
		}
		tx, err := bt.BeginTx(ctx, driver.TxOptions{}) // IMMEDIATE, from the DSN
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		if err := fn(dc); err != nil {
			if rerr := tx.Rollback(); rerr != nil {
				err = fmt.Errorf("%w (and roll back: %v)", err, rerr)
			}
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		return nil
	})
}

// batch runs b's statements in the open transaction.
func (c *Ceiling) batch(ctx context.Context, dc any, b *CeilingBatch, size int64) error {
	row := make([]driver.Value, 2)
	for _, s := range b.reads {
		if err := c.query(ctx, dc, s.query, s.args, row, "read"); err != nil {
			return err
		}
	}
	for _, s := range b.writes {
		if err := c.exec(ctx, dc, s.query, s.args, "write"); err != nil {
			return err
		}
	}
	now := time.Now().UnixNano()
	if len(b.inserts) > 0 {
		if err := c.query(ctx, dc, lastIDSQL, nil, row[:1], "read the last outbox id"); err != nil {
			return err
		}
		last, _ := row[0].(int64)
		for i, args := range b.inserts {
			for j, off := range b.offsets[i] {
				args[j*10].Value, args[j*10+7].Value = last+off, now
			}
			if err := c.exec(ctx, dc, insertChunksBySize[len(b.offsets[i])], args, "insert outbox rows"); err != nil {
				return err
			}
		}
		offs := b.offsets[len(b.offsets)-1]
		if err := c.exec(ctx, dc, setLastIDSQL, appendValues(nil, last+offs[len(offs)-1]), "store the last outbox id"); err != nil {
			return err
		}
	}
	if err := c.exec(ctx, dc, upsertPosition, appendValues(nil, b.feed, int64(0), b.epoch, b.last, size, now), "store position"); err != nil {
		return err
	}
	if err := c.exec(ctx, dc, addStats, appendValues(nil, b.lines, int64(0), int64(0), int64(0), int64(0), int64(0), now, b.feed), "update stats"); err != nil {
		return err
	}
	// The store's check, in every commit, that it still owns the database.
	return c.query(ctx, dc, `SELECT value FROM meta WHERE key = 'owner'`, nil, row[:1], "check owner")
}

// exec runs query on dc.
func (c *Ceiling) exec(ctx context.Context, dc any, query string, args []driver.NamedValue, what string) error {
	ds, err := c.stmt(dc, query)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	ex, ok := ds.(driver.StmtExecContext)
	if !ok {
		return fmt.Errorf("%s: the SQLite driver's statement is a %T", what, ds)
	}
	if _, err := ex.ExecContext(ctx, args); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// query runs query on dc and reads its rows into dest (or a buffer as
// wide as the rows, when dest is narrower), as the store reads them.
func (c *Ceiling) query(ctx context.Context, dc any, query string, args []driver.NamedValue, dest []driver.Value, what string) error {
	ds, err := c.stmt(dc, query)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	q, ok := ds.(driver.StmtQueryContext)
	if !ok {
		return fmt.Errorf("%s: the SQLite driver's statement is a %T", what, ds)
	}
	rows, err := q.QueryContext(ctx, args)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if len(dest) < len(rows.Columns()) {
		dest = make([]driver.Value, len(rows.Columns()))
	}
	for {
		if err := rows.Next(dest); err == io.EOF {
			break
		} else if err != nil {
			rows.Close()
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// LastOutboxID reads the largest outbox id assigned, in tx (a transaction
// of DB), for the naive loop; SetOutboxID stores it.
func (c *Ceiling) LastOutboxID(ctx context.Context, tx *sql.Tx) (int64, error) {
	var last int64
	if err := tx.QueryRowContext(ctx, lastIDSQL).Scan(&last); err != nil {
		return 0, fmt.Errorf("read the last outbox id: %w", err)
	}
	return last, nil
}

// SetOutboxID stores last as the largest outbox id assigned, in tx.
func (c *Ceiling) SetOutboxID(ctx context.Context, tx *sql.Tx, last int64) error {
	if _, err := tx.ExecContext(ctx, setLastIDSQL, last); err != nil {
		return fmt.Errorf("store the last outbox id: %w", err)
	}
	return nil
}

// PackRow is r as a chunk of its own, as Commit packs it: its body and
// its backlog bytes.
func (c *Ceiling) PackRow(r Row) (body []byte, bytes int64) {
	_, b, spans := packRows([]Row{r}, 0, 1, nil, nil, &compressor{})
	return b[spans[0].from:spans[0].to:spans[0].to], spans[0].bytes
}
