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

// Tx is one SQLite transaction of the ingest loop: a batch of items, each
// undone alone if it fails, plus the batch's positions and stats. A Tx is
// used by one goroutine at a time.
//
// Two things keep the per-item cost low. Outputs are kept in memory and
// written at Commit, many rows per INSERT, in the order they were emitted
// (so their ids are too). And an item's SAVEPOINT is opened only when the
// processor first reaches SQLite through the Tx (Exec, Get, Select, Stmt):
// an item that writes only outputs needs none.
type Tx struct {
	store        *Store
	tx           *sqlx.Tx
	ctx          context.Context
	place        Place
	n            int
	inItem       bool
	savepoint    bool     // the current item's SAVEPOINT is open
	itemStart    int      // len(rows) when the item began
	rows         []Row    // the outputs, IDs set as they are written
	undo         []func() // the current item's OnRollbackItem functions
	beforeCommit []func(ctx context.Context) error
	onCommit     []func()
	done         bool
	stmts        map[string]*sqlx.Stmt // used in this transaction
	toKeep       []string              // queries to keep prepared once the transaction ends
	arena        []byte                // holds copies of the outputs' keys and values
	forget       bool                  // the written rows' ids are not known: cache none
	lastID       int64                 // the last id written so far, 0 before the first chunk
	rowBytes     int64                 // the written rows' bytes, as RowBytes counts them
}

// Begin starts a write transaction. The transaction is not bound to ctx's
// cancellation: a shutdown must be able to commit the batch in hand. Statements
// run through the Tx take their own contexts.
func (s *Store) Begin(ctx context.Context) (*Tx, error) {
	ctx = context.WithoutCancel(ctx)
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		s.noteWrite(err)
		return nil, fmt.Errorf("begin: %w", err)
	}
	return &Tx{store: s, tx: tx, ctx: ctx}, nil
}

// Store is the store the transaction belongs to.
func (tx *Tx) Store() *Store { return tx.store }

// Exec runs a statement in the transaction.
func (tx *Tx) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := tx.ensureSavepoint(); err != nil {
		return nil, err
	}
	res, err := tx.tx.ExecContext(ctx, query, args...)
	return res, tx.store.noteStatement(err)
}

// Get scans one row into dest (sqlx rules); sql.ErrNoRows when there is none.
func (tx *Tx) Get(ctx context.Context, dest any, query string, args ...any) error {
	if err := tx.ensureSavepoint(); err != nil {
		return err
	}
	return tx.store.noteStatement(tx.tx.GetContext(ctx, dest, query, args...))
}

// Select scans every row into the slice dest points to (sqlx rules).
func (tx *Tx) Select(ctx context.Context, dest any, query string, args ...any) error {
	if err := tx.ensureSavepoint(); err != nil {
		return err
	}
	return tx.store.noteStatement(tx.tx.SelectContext(ctx, dest, query, args...))
}

// Stmt returns query prepared once per transaction: the way for a processor
// to run its hot statements without re-parsing them for every item.
func (tx *Tx) Stmt(ctx context.Context, query string) (*sqlx.Stmt, error) {
	if err := tx.ensureSavepoint(); err != nil {
		return nil, err
	}
	return tx.stmt(query)
}

// stmt returns query as a statement of the transaction. A query the store
// keeps prepared on the writer connection is reused without parsing it
// again; any other is prepared now and kept by the store once the
// transaction ends (it cannot be prepared on the connection the
// transaction holds), so the next transaction reuses it.
func (tx *Tx) stmt(query string) (*sqlx.Stmt, error) {
	if st, ok := tx.stmts[query]; ok {
		return st, nil
	}
	var st *sqlx.Stmt
	if kept := tx.store.keptStmt(query); kept != nil {
		st = tx.tx.StmtxContext(tx.ctx, kept)
	} else {
		var err error
		if st, err = tx.tx.PreparexContext(tx.ctx, query); err != nil {
			return nil, fmt.Errorf("prepare %q: %w", firstLine(query), err)
		}
		tx.toKeep = append(tx.toKeep, query)
	}
	if tx.stmts == nil {
		tx.stmts = map[string]*sqlx.Stmt{}
	}
	tx.stmts[query] = st
	return st, nil
}

// ensureSavepoint opens the current item's SAVEPOINT before its first
// statement.
func (tx *Tx) ensureSavepoint() error {
	if !tx.inItem || tx.savepoint {
		return nil
	}
	if _, err := tx.tx.ExecContext(tx.ctx, "SAVEPOINT item"); err != nil {
		return fmt.Errorf("savepoint: %w", tx.store.noteStatement(err))
	}
	tx.savepoint = true
	return nil
}

// BeginItem starts an item: p is the place of the outputs emitted until
// EndItem or RollbackItem, which keep or undo everything the item did.
func (tx *Tx) BeginItem(p Place) error {
	if tx.inItem {
		return errors.New("begin item: previous item still open")
	}
	tx.place, tx.n, tx.inItem, tx.savepoint, tx.itemStart = p, 0, true, false, len(tx.rows)
	tx.undo = tx.undo[:0]
	return nil
}

// SetPlace makes p the place of the outputs emitted next, outside any item,
// for writes that cannot fail part-way (a dead letter).
func (tx *Tx) SetPlace(p Place) { tx.place, tx.n = p, 0 }

// EndItem keeps the current item's writes.
func (tx *Tx) EndItem() error {
	tx.inItem = false
	tx.undo = tx.undo[:0]
	if !tx.savepoint {
		return nil
	}
	tx.savepoint = false
	if _, err := tx.tx.ExecContext(tx.ctx, "RELEASE item"); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// RollbackItem undoes every write since BeginItem (state and outputs alike);
// the batch's other items stand.
func (tx *Tx) RollbackItem() error {
	tx.inItem = false
	for i := len(tx.undo) - 1; i >= 0; i-- {
		tx.undo[i]()
	}
	tx.undo = tx.undo[:0]
	clear(tx.rows[tx.itemStart:]) // let the item's buffers go
	tx.rows = tx.rows[:tx.itemStart]
	if !tx.savepoint {
		return nil
	}
	tx.savepoint = false
	if _, err := tx.tx.ExecContext(tx.ctx, "ROLLBACK TO item"); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	if _, err := tx.tx.ExecContext(tx.ctx, "RELEASE item"); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// Emit adds o as an outbox row of the current place. The row is written at
// Commit. Emit copies o: its slices are the caller's again on return.
func (tx *Tx) Emit(_ context.Context, o Output) error {
	if o.Topic == "" {
		return errors.New("emit: output has no topic")
	}
	if tx.rows == nil {
		tx.rows = make([]Row, 0, tx.store.rowsHint.Load())
	}
	tx.rows = append(tx.rows, Row{Feed: tx.place.Feed, Partition: tx.place.Partition, Epoch: tx.place.Epoch,
		Position: tx.place.Position, N: tx.n, Topic: o.Topic,
		Key: tx.copyBytes(o.Key), Value: tx.copyBytes(o.Value), Headers: EncodeHeaders(o.Headers)})
	tx.n++
	return nil
}

// maxRowsHint caps the rows a transaction allocates room for up front.
const maxRowsHint = 1 << 13

// arenaSlab is the size of the arrays Emit copies keys and values to.
const arenaSlab = 64 << 10

// copyBytes copies b into the transaction's arena: one allocation serves
// many outputs. nil stays nil and empty stays empty (a null Kafka value is
// a tombstone, an empty one is not).
func (tx *Tx) copyBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	if len(b) == 0 {
		return []byte{}
	}
	if cap(tx.arena)-len(tx.arena) < len(b) {
		tx.arena = make([]byte, 0, max(arenaSlab, len(b)))
	}
	start := len(tx.arena)
	tx.arena = append(tx.arena, b...)
	return tx.arena[start:len(tx.arena):len(tx.arena)]
}

// OnRollbackItem registers f to run if the current item is rolled back: a
// processor that keeps state in memory during a batch undoes the item's
// changes there. Functions run in reverse order of registration.
func (tx *Tx) OnRollbackItem(f func()) {
	if tx.inItem {
		tx.undo = append(tx.undo, f)
	}
}

// BeforeCommit registers f to run at Commit, before the outputs are written
// and the transaction commits: a processor that keeps its state in memory
// during a batch writes it there. An error fails the commit.
func (tx *Tx) BeforeCommit(f func(ctx context.Context) error) {
	tx.beforeCommit = append(tx.beforeCommit, f)
}

// OnCommit registers f to run after the transaction commits (never if it
// does not), in registration order, before the feed commits its own pointer.
func (tx *Tx) OnCommit(f func()) { tx.onCommit = append(tx.onCommit, f) }

// Emitted is the number of output rows the transaction holds.
func (tx *Tx) Emitted() int { return len(tx.rows) }

// Commit checks the store still owns the database (ErrFenced otherwise,
// see Claim), runs the store's commit hook, commits, then runs the OnCommit
// callbacks. When the hook or COMMIT fails the transaction is rolled back
// and the error returned: none of its writes stand.
func (tx *Tx) Commit() error {
	if tx.done {
		return errors.New("commit: transaction already finished")
	}
	tx.done = true
	if err := tx.commit(); err != nil {
		tx.tx.Rollback()
		tx.store.noteWrite(err)
		return fmt.Errorf("commit: %w", err)
	}
	tx.store.noteWrite(nil)
	tx.store.meter.committed(tx.lastID, tx.rowBytes)
	tx.store.keepStmts(tx.ctx, tx.toKeep)
	tx.store.rowsHint.Store(int64(min(len(tx.rows), maxRowsHint)))
	if !tx.forget {
		tx.store.recent.add(tx.rows) // the cache owns them now
	}
	if len(tx.rows) > 0 {
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

// commit writes the outputs, runs the commit hook and commits.
func (tx *Tx) commit() error {
	if err := tx.prepareCommit(); err != nil {
		return err
	}
	if h := tx.store.hook(); h != nil {
		if err := h(tx.ctx); err != nil {
			return err
		}
	}
	return tx.tx.Commit()
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
