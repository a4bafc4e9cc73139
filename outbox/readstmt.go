package outbox

import (
	"context"

	"github.com/jmoiron/sqlx"
)

// ReadStmt is Stmt for a query that only reads: it does not open the
// current item's SAVEPOINT, since a read has nothing to undo. A processor
// that looks state up before deciding whether to write (the ledger reading
// a balance it does not have in memory) saves a SAVEPOINT and a RELEASE per
// item, a third of the cost of such an item. Running a statement that
// writes through it would leave that write outside the item's undo: the
// item's rollback would not take it back.
func (tx *Tx) ReadStmt(ctx context.Context, query string) (*sqlx.Stmt, error) {
	return tx.stmt(query)
}
