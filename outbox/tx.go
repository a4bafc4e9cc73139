package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	sqlite3 "modernc.org/sqlite/lib"
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
// A Tx keeps no context. A method that takes one (Exec, Get, Select,
// Emit, Batch's statements, ...) honours it: its statement runs with it,
// and a done context fails the call with the context's error. What the Tx
// runs for itself, the item's savepoint, the probe of a lost transaction
// and all of Commit (its BeforeCommit functions, the outputs, the commit
// hook), is bound to no context (txCtx): a transaction must be able to
// commit the batch in hand while the process shuts down.
//
// Two things keep the per-item cost low. Outputs are kept in memory and
// written at Commit, packed many to a SQLite row (see chunk.go), in the
// order they were emitted (so their ids are too). And an item's SAVEPOINT is opened only when the
// processor first reaches SQLite through the Tx (Exec, Get, Select, Stmt):
// an item that writes only outputs needs none.
type Tx struct {
	store        *Store
	conn         *sqlx.Conn // the writer connection, held for the transaction (see Batch)
	tx           *sqlx.Tx
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
	committing   bool                  // the BeforeCommit functions are running: they may still use the Tx
	stmts        map[string]*sqlx.Stmt // used in this transaction
	toKeep       []string              // queries to keep prepared once the transaction ends
	arena        []byte                // holds copies of the outputs' keys and values
	lastID       int64                 // the last id written so far, 0 before the first chunk
	rowBytes     int64                 // the written rows' bytes, as the backlog counts them (chunkBytes)
	lost         error                 // set once SQLite rolled the transaction back under it
	batch        Batch                 // reused by each Batch call
	parts        []feedPart            // the group feeds' partitions touched, see checkPartitions
}

// txCtx is the context of what a Tx runs for itself (see Tx): never done.
func txCtx() context.Context { return context.Background() }

// ErrTxLost is wrapped by the errors of a Tx that SQLite rolled back by
// itself: a write interrupted by its context's deadline, or one that met a
// full disk, an I/O error or a lack of memory, ends the whole transaction,
// not only the statement or the item's savepoint. Nothing the Tx wrote
// stands, and it runs no statement any more (on the connection, now out of
// any transaction, each would commit by itself): Commit fails too. Start
// the work again in a new transaction.
var ErrTxLost = errors.New("SQLite rolled the whole transaction back")

// Begin starts a write transaction; ctx serves only to begin it. The
// transaction is not bound to ctx's cancellation: a shutdown must be able
// to commit the batch in hand. See Tx for the contexts of its methods.
func (s *Store) Begin(ctx context.Context) (*Tx, error) {
	ctx = context.WithoutCancel(ctx)
	// The transaction runs on a connection of its own, not the pool's,
	// so that Batch can reach the driver's connection while it is open.
	conn, err := s.db.Connx(ctx)
	if err != nil {
		s.noteWrite(err)
		return nil, fmt.Errorf("begin: writer connection: %w", err)
	}
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		conn.Close()
		s.noteWrite(err)
		return nil, fmt.Errorf("begin: %w", err)
	}
	return &Tx{store: s, conn: conn, tx: tx}, nil
}

// release gives the writer connection back to the pool once the
// transaction has ended: the store's own uses of it (keeping statements
// prepared, say) wait for it.
func (tx *Tx) release() {
	if tx.conn != nil {
		tx.store.watch.unwatch()
		tx.conn.Close()
		tx.conn = nil
	}
}

// Store is the store the transaction belongs to.
func (tx *Tx) Store() *Store { return tx.store }

// Exec runs a statement in the transaction.
//
// An error may mean SQLite rolled the whole transaction back (see
// ErrTxLost): the error then wraps ErrTxLost, and so does every later use
// of the Tx.
func (tx *Tx) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := tx.ensureSavepoint(); err != nil {
		return nil, err
	}
	res, err := tx.tx.ExecContext(ctx, query, args...)
	return res, tx.statementDone(err)
}

// Get scans one row into dest (sqlx rules); sql.ErrNoRows when there is
// none. Its errors are as Exec's.
func (tx *Tx) Get(ctx context.Context, dest any, query string, args ...any) error {
	if err := tx.ensureSavepoint(); err != nil {
		return err
	}
	return tx.statementDone(tx.tx.GetContext(ctx, dest, query, args...))
}

// Select scans every row into the slice dest points to (sqlx rules). Its
// errors are as Exec's.
func (tx *Tx) Select(ctx context.Context, dest any, query string, args ...any) error {
	if err := tx.ensureSavepoint(); err != nil {
		return err
	}
	return tx.statementDone(tx.tx.SelectContext(ctx, dest, query, args...))
}

// Stmt returns query prepared once per transaction: the way for a processor
// to run its hot statements without re-parsing them for every item. After
// an error of one of its statements, return the error: SQLite may have
// rolled the transaction back, which EndItem or RollbackItem then report
// (ErrTxLost).
func (tx *Tx) Stmt(ctx context.Context, query string) (*sqlx.Stmt, error) {
	if err := tx.ensureSavepoint(); err != nil {
		return nil, err
	}
	return tx.stmt(query)
}

// Lost returns the error (wrapping ErrTxLost) of a transaction SQLite
// rolled back by itself, nil while it stands.
func (tx *Tx) Lost() error { return tx.lost }

// statementDone notes a statement's error and finds out whether SQLite
// ended the transaction with it.
func (tx *Tx) statementDone(err error) error {
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return err
	}
	tx.store.noteStatement(err)
	return tx.checkLost(err)
}

// checkLost asks SQLite, after a failure, whether the transaction still
// stands: a BEGIN fails inside a transaction and changes nothing; one that
// succeeds shows the connection was out of any, and is rolled back at
// once. A lost transaction makes err wrap ErrTxLost, and so every later use
// of the Tx.
func (tx *Tx) checkLost(err error) error {
	if tx.lost != nil {
		return tx.lost
	}
	if tx.store.pg {
		return tx.checkLostPG(err)
	}
	if !mayEndTransaction(err) {
		return err
	}
	if _, berr := tx.tx.ExecContext(txCtx(), "BEGIN"); berr != nil {
		return err // inside a transaction still
	}
	if _, rerr := tx.tx.ExecContext(txCtx(), "ROLLBACK"); rerr != nil {
		err = fmt.Errorf("%w (and ending the probe's transaction: %v)", err, rerr)
	}
	tx.lost = fmt.Errorf("%w: %w", ErrTxLost, err)
	return tx.lost
}

// mayEndTransaction reports whether err is one after which SQLite may
// have rolled the whole transaction back by itself: a full disk, an I/O
// error, a lack of memory, an interrupted statement, a busy or damaged
// database, or an error that carries no SQLite code (a context's, say).
// A statement's plain failure (a syntax error, a constraint, a refusal of
// the authorizer) leaves the transaction as it was, and is not probed: the
// probe would run under the same authorizer.
func mayEndTransaction(err error) bool {
	code, ok := SQLiteCode(err)
	if !ok {
		return true
	}
	switch code & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_INTERRUPT,
		sqlite3.SQLITE_BUSY, sqlite3.SQLITE_CORRUPT:
		return true
	}
	return false
}

// stmt returns query as a statement of the transaction. A query the store
// keeps prepared on the writer connection is reused without parsing it
// again; any other is prepared now and kept by the store once the
// transaction ends (it cannot be prepared on the connection the
// transaction holds), so the next transaction reuses it.
func (tx *Tx) stmt(query string) (*sqlx.Stmt, error) {
	if tx.lost != nil {
		return nil, tx.lost
	}
	if st, ok := tx.stmts[query]; ok {
		return st, nil
	}
	var st *sqlx.Stmt
	if kept := tx.store.keptStmt(query); kept != nil {
		st = tx.tx.StmtxContext(txCtx(), kept)
	} else {
		var err error
		if st, err = tx.tx.PreparexContext(txCtx(), query); err != nil {
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
// statement. It fails on a lost transaction: a SAVEPOINT outside any would
// start one of its own.
func (tx *Tx) ensureSavepoint() error {
	if tx.lost != nil {
		return tx.lost
	}
	if !tx.inItem || tx.savepoint {
		return nil
	}
	if err := tx.control(sqlSavepoint); err != nil {
		return fmt.Errorf("savepoint: %w", tx.store.noteStatement(err))
	}
	tx.savepoint = true
	return nil
}

// The item savepoint's statements, kept prepared like the processors'
// statements: parsing them again for every item costs as much as a small
// item's work.
const (
	sqlSavepoint  = "SAVEPOINT item"
	sqlRelease    = "RELEASE item"
	sqlRollbackTo = "ROLLBACK TO item"
)

// control runs one of the savepoint's statements.
func (tx *Tx) control(query string) error {
	st, err := tx.stmt(query)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(txCtx())
	return err
}

// BeginItem starts an item: p is the place of the outputs emitted until
// EndItem or RollbackItem, which keep or undo everything the item did.
func (tx *Tx) BeginItem(p Place) error {
	if tx.inItem {
		return errors.New("begin item: previous item still open")
	}
	tx.place, tx.n, tx.inItem, tx.savepoint, tx.itemStart = p, 0, true, false, len(tx.rows)
	tx.touch(p.Feed, p.Partition)
	tx.undo = tx.undo[:0]
	return nil
}

// SetPlace makes p the place of the outputs emitted next, outside any item,
// for writes that cannot fail part-way (a dead letter).
func (tx *Tx) SetPlace(p Place) {
	tx.place, tx.n = p, 0
	tx.touch(p.Feed, p.Partition)
}

// EndItem keeps the current item's writes. Its error wraps ErrTxLost when
// SQLite had rolled the transaction back during the item.
func (tx *Tx) EndItem() error {
	tx.inItem = false
	tx.undo = tx.undo[:0]
	if !tx.savepoint {
		return tx.lost
	}
	tx.savepoint = false
	if err := tx.releaseItem(); err != nil {
		return fmt.Errorf("release savepoint: %w", tx.checkLost(err))
	}
	return nil
}

// releaseItem releases the item's savepoint: on SQLite, on the driver's
// connection, as Batch opened it.
func (tx *Tx) releaseItem() error {
	if tx.store.pg {
		return tx.control(sqlRelease)
	}
	return tx.conn.Raw(func(dc any) error { return tx.controlOn(dc, sqlRelease) })
}

// RollbackItem undoes every write since BeginItem (state and outputs alike);
// the batch's other items stand. Its error wraps ErrTxLost when SQLite had
// rolled the whole transaction back during the item: then none of them
// stands.
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
	if err := tx.control(sqlRollbackTo); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", tx.checkLost(err))
	}
	if err := tx.control(sqlRelease); err != nil {
		return fmt.Errorf("release savepoint: %w", tx.checkLost(err))
	}
	return nil
}

// Emit adds o as an outbox row of the current place. The row is written at
// Commit. Emit copies o: its slices are the caller's again on return. It
// fails with ctx's error when ctx is done, as a statement would.
func (tx *Tx) Emit(ctx context.Context, o Output) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("emit: %w", err)
	}
	if o.Topic == "" {
		return errors.New("emit: output has no topic")
	}
	if tx.store.pg {
		if err := checkPGText("emit: topic", o.Topic); err != nil {
			return err
		}
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

// maxRowsHint caps the rows a transaction allocates room for up front:
// above the ingest loop's default batch (16,000 items), so a full batch of
// one output an item never copies its rows to a larger array half way.
const maxRowsHint = 1 << 15

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
// during a batch writes it there, through the Tx (Stmt, Exec, Batch). An
// error fails the commit.
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
// and the error returned: none of its writes stand. A lost transaction
// (ErrTxLost) is not committed.
func (tx *Tx) Commit() error {
	if tx.done {
		return errors.New("commit: transaction already finished")
	}
	tx.done = true
	defer tx.release()
	if tx.lost != nil {
		tx.tx.Rollback()
		return fmt.Errorf("commit: %w", tx.lost)
	}
	if err := tx.commit(); err != nil {
		tx.tx.Rollback()
		tx.store.noteWrite(err)
		return fmt.Errorf("commit: %w", err)
	}
	tx.release()
	tx.store.noteWrite(nil)
	tx.store.meter.committed(tx.lastID, tx.rowBytes)
	tx.store.keepStmts(txCtx(), tx.toKeep)
	tx.store.rowsHint.Store(int64(min(len(tx.rows), maxRowsHint)))
	tx.store.recent.add(tx.rows) // the cache owns them now
	if len(tx.rows) > 0 {
		select {
		case tx.store.committed <- struct{}{}:
		default:
		}
		tx.store.commits.fire()
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
		if err := h(txCtx()); err != nil {
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
	defer tx.release()
	if err := tx.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("rollback: %w", err)
	}
	return nil
}
