package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
)

// The statements naive_sqlite runs per line: the state, the feed's
// position and the output, a chunk of its own (naiveInsertOutbox binds last
// id, position, feed, epoch, topic, creation time, bytes and body); and
// once per batch the last outbox id.
const (
	naiveUpsertState = `INSERT INTO ledger_balances (feed, account, balance, lines) VALUES (?, ?, ?, 1)
ON CONFLICT(feed, account) DO UPDATE SET balance = balance + excluded.balance, lines = lines + 1
RETURNING balance`
	naiveUpdatePosition = `UPDATE positions SET epoch = ?, position = ?, source_end = ?, updated_at = ?
WHERE feed = ? AND partition = 0`
	naiveInsertOutbox = `INSERT INTO outbox_chunks (last_id, count, position, feed, partition, epoch, topic, created_at, bytes, body)
VALUES (?, 1, ?, ?, 0, ?, ?, ?, ?, ?)`
)

// naiveWriter is the simplest loop that writes the engine's rows: a
// transaction per batch, three prepared statements per line. It is no
// ceiling (the engine writes a batch in far fewer statements), so no ratio
// is printed against it: it shows what those statements save.
type naiveWriter struct {
	c                  *outbox.Ceiling
	db                 *sql.DB
	state, pos, output *sql.Stmt
	topic              string
	size               int64
	ledger             bool
}

// runNaiveSQLite measures the naive loop.
func (b *bench) runNaiveSQLite(ctx context.Context) error {
	f, err := openFloorDB(ctx, b.path("naive.db"), b.o.Synchronous)
	if err != nil {
		return err
	}
	defer f.close()
	w := &naiveWriter{c: f.c, db: f.db, topic: b.topic("raw"), size: b.data.Size, ledger: b.o.Processor == "ledger"}
	if err := w.prepare(ctx); err != nil {
		return err
	}
	g := b.data.gen()
	m := b.startInProcess()
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
	res := newPhaseResult(b.data.Lines, time.Since(start))
	m.finish(b, "naive_sqlite", res)
	b.res.NaiveSQLite = res
	return nil
}

func (w *naiveWriter) prepare(ctx context.Context) error {
	if _, err := w.db.ExecContext(ctx, `INSERT INTO positions (feed, partition, epoch, position, updated_at) VALUES (?, 0, ?, 0, ?)`,
		benchFeed, floorEpoch, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("insert position: %w", err)
	}
	var err error
	if w.state, err = w.db.PrepareContext(ctx, naiveUpsertState); err != nil {
		return fmt.Errorf("prepare state upsert: %w", err)
	}
	if w.pos, err = w.db.PrepareContext(ctx, naiveUpdatePosition); err != nil {
		return fmt.Errorf("prepare position update: %w", err)
	}
	if w.output, err = w.db.PrepareContext(ctx, naiveInsertOutbox); err != nil {
		return fmt.Errorf("prepare outbox insert: %w", err)
	}
	return nil
}

// batch writes the next n lines in one transaction.
func (w *naiveWriter) batch(ctx context.Context, g *lineGen, n int64) error {
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	state, pos, output := tx.StmtContext(ctx, w.state), tx.StmtContext(ctx, w.pos), tx.StmtContext(ctx, w.output)
	last, err := w.c.LastOutboxID(ctx, tx)
	if err != nil {
		return err
	}
	for range n {
		l, text := g.next()
		last++
		if err := w.line(ctx, l, text, last, state, pos, output); err != nil {
			return err
		}
	}
	if err := w.c.SetOutboxID(ctx, tx, last); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// line writes one line's rows, its output with id id.
func (w *naiveWriter) line(ctx context.Context, l benchLine, text []byte, id int64, state, pos, output *sql.Stmt) error {
	now := time.Now().UnixNano()
	var key, v []byte
	if w.ledger {
		account := accountName(l.Account)
		var balance int64
		if err := state.QueryRowContext(ctx, benchFeed, account, l.Amount).Scan(&balance); err != nil {
			return fmt.Errorf("upsert balance: %w", err)
		}
		var err error
		if v, err = json.Marshal(ledger.Output{Account: account, Amount: l.Amount, Balance: balance,
			Feed: benchFeed, Epoch: floorEpoch, Position: l.Position}); err != nil {
			return fmt.Errorf("encode output: %w", err)
		}
		key = []byte(account)
	} else {
		v = text[:len(text)-1]
	}
	if _, err := pos.ExecContext(ctx, floorEpoch, l.Position, w.size, now, benchFeed); err != nil {
		return fmt.Errorf("update position: %w", err)
	}
	body, bytes := w.c.PackRow(outbox.Row{Feed: benchFeed, Epoch: floorEpoch, Topic: w.topic, Position: l.Position, Key: key, Value: v})
	if _, err := output.ExecContext(ctx, id, l.Position, benchFeed, floorEpoch, w.topic, now, bytes, body); err != nil {
		return fmt.Errorf("insert outbox row: %w", err)
	}
	return nil
}
