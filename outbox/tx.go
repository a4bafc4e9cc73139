package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Output is a record a processor emits: it becomes one outbox row, published
// by the relay after the transaction commits.
type Output struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers []Header
}

// Place names the item a Tx is working on: every output row written while
// it is current carries it, numbered n = 0, 1, 2, ...
type Place struct {
	Feed      string
	Partition int32
	Epoch     string
	Position  int64
}

// Tx is one SQLite transaction of the ingest loop: a batch of items, each in
// its own SAVEPOINT, plus the batch's positions and stats. A Tx is used by
// one goroutine at a time.
type Tx struct {
	store    *Store
	tx       *sqlx.Tx
	ctx      context.Context
	place    Place
	n        int
	emitted  int
	inItem   bool
	onCommit []func()
	done     bool
	stmts    map[string]*sqlx.Stmt // prepared in this transaction
}

// Begin starts a write transaction. The transaction is not bound to ctx's
// cancellation: a shutdown must be able to commit the batch in hand. Statements
// run through the Tx take their own contexts.
func (s *Store) Begin(ctx context.Context) (*Tx, error) {
	ctx = context.WithoutCancel(ctx)
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	return &Tx{store: s, tx: tx, ctx: ctx}, nil
}

// Store is the store the transaction belongs to.
func (tx *Tx) Store() *Store { return tx.store }

// Exec runs a statement in the transaction.
func (tx *Tx) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return tx.tx.ExecContext(ctx, query, args...)
}

// Get scans one row into dest (sqlx rules); sql.ErrNoRows when there is none.
func (tx *Tx) Get(ctx context.Context, dest any, query string, args ...any) error {
	return tx.tx.GetContext(ctx, dest, query, args...)
}

// Select scans every row into the slice dest points to (sqlx rules).
func (tx *Tx) Select(ctx context.Context, dest any, query string, args ...any) error {
	return tx.tx.SelectContext(ctx, dest, query, args...)
}

// Stmt returns query prepared once per transaction: the way for a processor
// to run its hot statements without re-parsing them for every item.
func (tx *Tx) Stmt(ctx context.Context, query string) (*sqlx.Stmt, error) {
	if st, ok := tx.stmts[query]; ok {
		return st, nil
	}
	st, err := tx.tx.PreparexContext(tx.ctx, query)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", firstLine(query), err)
	}
	if tx.stmts == nil {
		tx.stmts = map[string]*sqlx.Stmt{}
	}
	tx.stmts[query] = st
	return st, nil
}

// BeginItem opens a SAVEPOINT for one item and makes p the place of the
// outputs emitted until EndItem or RollbackItem.
func (tx *Tx) BeginItem(p Place) error {
	if tx.inItem {
		return errors.New("begin item: previous item still open")
	}
	if _, err := tx.tx.ExecContext(tx.ctx, "SAVEPOINT item"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	tx.place, tx.n, tx.inItem = p, 0, true
	return nil
}

// SetPlace makes p the place of the outputs emitted next without a
// savepoint, for writes that cannot fail part-way (a dead letter).
func (tx *Tx) SetPlace(p Place) { tx.place, tx.n = p, 0 }

// EndItem keeps the current item's writes.
func (tx *Tx) EndItem() error {
	tx.inItem = false
	if _, err := tx.tx.ExecContext(tx.ctx, "RELEASE item"); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// RollbackItem undoes every write since BeginItem (state and outputs alike);
// the batch's other items stand.
func (tx *Tx) RollbackItem() error {
	tx.inItem = false
	tx.emitted -= tx.n
	if _, err := tx.tx.ExecContext(tx.ctx, "ROLLBACK TO item"); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	if _, err := tx.tx.ExecContext(tx.ctx, "RELEASE item"); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

const insertOutbox = `INSERT INTO outbox (feed, partition, epoch, position, n, topic, key, value, headers, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// Emit writes o as an outbox row of the current place.
func (tx *Tx) Emit(ctx context.Context, o Output) error {
	if o.Topic == "" {
		return errors.New("emit: output has no topic")
	}
	st, err := tx.Stmt(ctx, insertOutbox)
	if err != nil {
		return err
	}
	p := tx.place
	if _, err := st.ExecContext(ctx, p.Feed, p.Partition, p.Epoch, p.Position, tx.n, o.Topic,
		o.Key, o.Value, EncodeHeaders(o.Headers), tx.store.Now().UnixNano()); err != nil {
		return fmt.Errorf("insert outbox row: %w", err)
	}
	tx.n++
	tx.emitted++
	return nil
}

// OnCommit registers f to run after the transaction commits (never if it
// does not), in registration order, before the feed commits its own pointer.
func (tx *Tx) OnCommit(f func()) { tx.onCommit = append(tx.onCommit, f) }

// Emitted is the number of output rows the transaction holds.
func (tx *Tx) Emitted() int { return tx.emitted }

// Commit checks the store still owns the database (ErrFenced otherwise,
// see Claim), runs the store's commit hook, commits, then runs the OnCommit
// callbacks. When the hook or COMMIT fails the transaction is rolled back
// and the error returned: none of its writes stand.
func (tx *Tx) Commit() error {
	if tx.done {
		return errors.New("commit: transaction already finished")
	}
	tx.done = true
	if err := tx.checkOwner(); err != nil {
		tx.tx.Rollback()
		return fmt.Errorf("commit: %w", err)
	}
	if h := tx.store.hook(); h != nil {
		if err := h(tx.ctx); err != nil {
			tx.tx.Rollback()
			return fmt.Errorf("commit: %w", err)
		}
	}
	if err := tx.tx.Commit(); err != nil {
		tx.tx.Rollback()
		return fmt.Errorf("commit: %w", err)
	}
	if tx.emitted > 0 {
		select {
		case tx.store.committed <- struct{}{}:
		default:
		}
	}
	for _, f := range tx.onCommit {
		f()
	}
	return nil
}

// Rollback abandons the transaction. It is a no-op after Commit, so it can
// be deferred.
func (tx *Tx) Rollback() error {
	if tx.done {
		return nil
	}
	tx.done = true
	if err := tx.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("rollback: %w", err)
	}
	return nil
}
