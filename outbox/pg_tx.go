package outbox

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// checkLostPG is checkLost on PostgreSQL, which needs no probe: a failed
// statement aborts the whole transaction there, and only a ROLLBACK TO the
// item's savepoint brings it back. So an error inside an open savepoint
// leaves the transaction to RollbackItem (unless the connection itself is
// gone), and any other ends it.
func (tx *Tx) checkLostPG(err error) error {
	if tx.savepoint && !pgConnGone(err) {
		return err
	}
	tx.lost = fmt.Errorf("%w: %w", errPGTxLost{}, err)
	return tx.lost
}

// errPGTxLost is ErrTxLost as PostgreSQL's messages say it.
type errPGTxLost struct{}

func (errPGTxLost) Error() string { return "PostgreSQL aborted the whole transaction" }

// Is makes the error match ErrTxLost.
func (errPGTxLost) Is(target error) bool { return target == ErrTxLost }

// pgConnGone reports whether err says the connection, and with it the
// transaction, is gone: an error that carries no SQLSTATE from the
// server (pgconn's own: a closed or timed-out connection, a context's).
func pgConnGone(err error) bool {
	var pe *pgconn.PgError
	return !errors.As(err, &pe)
}
