package outbox

import (
	"context"

	"github.com/jmoiron/sqlx"
)

// ReadTx is one read transaction on the store's read-only pool, handed to
// the function View runs: every statement in it sees the same commit, none
// waits for the writer, and none can write (the pool's connections are
// query_only). It is valid only inside that function and is used by one
// goroutine at a time.
type ReadTx struct {
	tx *sqlx.Tx
}

// Get scans one row into dest (sqlx rules); sql.ErrNoRows when there is none.
func (r *ReadTx) Get(ctx context.Context, dest any, query string, args ...any) error {
	return r.tx.GetContext(ctx, dest, query, args...)
}

// Select scans every row into the slice dest points to (sqlx rules).
func (r *ReadTx) Select(ctx context.Context, dest any, query string, args ...any) error {
	return r.tx.SelectContext(ctx, dest, query, args...)
}

// Query runs query for a caller that reads its rows one at a time (a large
// table without holding it all): the caller closes the rows before the
// View's function returns.
func (r *ReadTx) Query(ctx context.Context, query string, args ...any) (*sqlx.Rows, error) {
	return r.tx.QueryxContext(ctx, query, args...)
}

// View runs f in one read transaction of the read-only pool and returns
// f's error (wrapped by nothing, so a caller can match sql.ErrNoRows) or
// the error of beginning the transaction. It is how a processor's
// read-only queries outside the ingest transaction (a warm-up, a report)
// reach its tables: they never block the writer, and a write through r
// fails. Safe for concurrent use.
func (s *Store) View(ctx context.Context, f func(r *ReadTx) error) error {
	return s.readTx(ctx, func(tx *sqlx.Tx) error { return f(&ReadTx{tx: tx}) })
}
