package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
)

// The ceilings' rows name this feed and epoch; the engine's epoch is a file
// identity of about the same length.
const (
	rawFeed  = "bench"
	rawEpoch = "raw:00000:0000000000000000"
)

// The three statements raw_sqlite runs per line: the state, the feed's
// position and the output row, as the engine writes them.
const (
	rawUpsertState = `INSERT INTO ledger_balances (feed, account, balance, lines) VALUES (?, ?, ?, 1)
ON CONFLICT(feed, account) DO UPDATE SET balance = balance + excluded.balance, lines = lines + 1
RETURNING balance`
	rawUpdatePosition = `UPDATE positions SET epoch = ?, position = ?, source_end = ?, updated_at = ?
WHERE feed = ? AND partition = 0`
	rawInsertOutbox = `INSERT INTO outbox (feed, partition, epoch, position, n, topic, key, value, headers, created_at)
VALUES (?, 0, ?, ?, 0, ?, ?, ?, NULL, ?)`
)

// rawWriter is the simplest loop that writes the engine's rows: one writer
// connection, a transaction per batch, three prepared statements per line.
type rawWriter struct {
	db                 *sql.DB
	state, pos, output *sql.Stmt
	topic              string
	size               int64
}

// runRawSQLite measures the ingest ceiling.
func (b *bench) runRawSQLite(ctx context.Context) error {
	path := b.path("raw.db")
	w, err := openRawWriter(ctx, path, b.o.Synchronous)
	if err != nil {
		return err
	}
	defer w.close()
	w.topic, w.size = b.topic("raw"), b.data.Size
	if b.res.Settings.SQLiteVersion, err = w.version(ctx); err != nil {
		return err
	}
	g := newLedgerGen(b.data.Names)
	// Statements get a context that is never done: with one that can be,
	// the driver starts a goroutine per statement to watch it. The run's
	// context is checked between batches instead.
	sctx := context.WithoutCancel(ctx)
	start := time.Now()
	for left := b.data.Lines; left > 0; left -= int64(b.o.BatchMax) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.batch(sctx, g, min(left, int64(b.o.BatchMax))); err != nil {
			return err
		}
	}
	b.res.RawSQLite = newPhaseResult(b.data.Lines, time.Since(start))
	return nil
}

// openRawWriter creates the schema through the store (then closes it: the
// store does nothing more), opens one connection with the store's settings
// and prepares the three statements.
func openRawWriter(ctx context.Context, path, synchronous string) (*rawWriter, error) {
	cfg := outbox.DefaultConfig(path)
	cfg.Synchronous = synchronous
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Close(); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", rawDSN(path, synchronous))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	w := &rawWriter{db: db}
	if err := w.prepare(ctx); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// rawDSN is the store's writer DSN: WAL, the synchronous mode, BEGIN IMMEDIATE.
func rawDSN(path, synchronous string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + esc + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(wal)&_pragma=synchronous(" +
		synchronous + ")&_pragma=foreign_keys(on)&_txlock=immediate"
}

// prepare creates the feed's rows (positions references feeds) and the
// statements.
func (w *rawWriter) prepare(ctx context.Context) error {
	now := time.Now().UnixNano()
	if _, err := w.db.ExecContext(ctx, `INSERT INTO feeds (name, kind, processor) VALUES (?, 'file', 'ledger')`, rawFeed); err != nil {
		return fmt.Errorf("insert feed: %w", err)
	}
	if _, err := w.db.ExecContext(ctx, `INSERT INTO positions (feed, partition, epoch, position, updated_at) VALUES (?, 0, ?, 0, ?)`,
		rawFeed, rawEpoch, now); err != nil {
		return fmt.Errorf("insert position: %w", err)
	}
	var err error
	if w.state, err = w.db.PrepareContext(ctx, rawUpsertState); err != nil {
		return fmt.Errorf("prepare state upsert: %w", err)
	}
	if w.pos, err = w.db.PrepareContext(ctx, rawUpdatePosition); err != nil {
		return fmt.Errorf("prepare position update: %w", err)
	}
	if w.output, err = w.db.PrepareContext(ctx, rawInsertOutbox); err != nil {
		return fmt.Errorf("prepare outbox insert: %w", err)
	}
	return nil
}

// version is SQLite's version.
func (w *rawWriter) version(ctx context.Context) (string, error) {
	var v string
	if err := w.db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err != nil {
		return "", fmt.Errorf("read sqlite version: %w", err)
	}
	return v, nil
}

// batch writes the next n lines in one transaction.
func (w *rawWriter) batch(ctx context.Context, g *ledgerGen, n int64) error {
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	state, pos, output := tx.StmtContext(ctx, w.state), tx.StmtContext(ctx, w.pos), tx.StmtContext(ctx, w.output)
	for range n {
		l, _ := g.next()
		if err := w.line(ctx, g.names[l.Account], l, state, pos, output); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// line writes one line's three rows.
func (w *rawWriter) line(ctx context.Context, account string, l benchLine, state, pos, output *sql.Stmt) error {
	var balance int64
	if err := state.QueryRowContext(ctx, rawFeed, account, l.Amount).Scan(&balance); err != nil {
		return fmt.Errorf("upsert balance: %w", err)
	}
	now := time.Now().UnixNano()
	if _, err := pos.ExecContext(ctx, rawEpoch, l.Position, w.size, now, rawFeed); err != nil {
		return fmt.Errorf("update position: %w", err)
	}
	v, err := json.Marshal(ledger.Output{Account: account, Amount: l.Amount, Balance: balance,
		Feed: rawFeed, Epoch: rawEpoch, Position: l.Position})
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	if _, err := output.ExecContext(ctx, rawFeed, rawEpoch, l.Position, w.topic, []byte(account), v, now); err != nil {
		return fmt.Errorf("insert outbox row: %w", err)
	}
	return nil
}

// close closes the statements and the connection.
func (w *rawWriter) close() error {
	for _, st := range []*sql.Stmt{w.state, w.pos, w.output} {
		if st != nil {
			st.Close()
		}
	}
	if err := w.db.Close(); err != nil {
		return fmt.Errorf("close raw database: %w", err)
	}
	return nil
}
