// Package outboxtest opens stores for the tests of other packages (OpenStore,
// NewStore, TempStore, StoreAt: closed when the test ends; on PostgreSQL
// under EnvStore=postgres), and lets them look into and set up
// an outbox.Store's database with plain SQL, where the store has no named
// method because nothing but a test needs one (a relay progress set back,
// a page limit that makes the disk full, a table the processor's setup
// would have made). Reads go through Store.View; statements run on the
// store's one writer connection, so per-connection state (a PRAGMA, an
// ATTACH, the store's SQL authorizer) is the store's own.
//
// It is for tests only: a statement run here bypasses everything the store
// keeps beside the database (its backlog meter, its recent rows), and Exec
// waits for the writer connection, so it must not be called while a Tx of
// the store is open.
package outboxtest

import (
	"context"
	"database/sql"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/internal/handle"
)

// Exec runs query on s's writer connection, outside any transaction of the
// store.
func Exec(ctx context.Context, s *outbox.Store, query string, args ...any) (sql.Result, error) {
	return handle.Writer(s).ExecContext(ctx, query, args...)
}

// Get scans one row of query, read in one read transaction of s's read
// pool, into dest (sqlx rules); sql.ErrNoRows when there is none.
func Get(ctx context.Context, s *outbox.Store, dest any, query string, args ...any) error {
	return s.View(ctx, func(r *outbox.ReadTx) error { return r.Get(ctx, dest, query, args...) })
}

// Select scans every row of query, read as Get reads, into the slice dest
// points to.
func Select(ctx context.Context, s *outbox.Store, dest any, query string, args ...any) error {
	return s.View(ctx, func(r *outbox.ReadTx) error { return r.Select(ctx, dest, query, args...) })
}

// Balances reads table's account and balance columns (a SQL processor's
// balances, as examples/ledger.yaml makes them) into a map, in one read
// transaction of s's read pool.
func Balances(ctx context.Context, s *outbox.Store, table string) (map[string]int64, error) {
	var rs []struct {
		Account string `db:"account"`
		Balance int64  `db:"balance"`
	}
	if err := Select(ctx, s, &rs, "SELECT account, balance FROM "+table); err != nil {
		return nil, err
	}
	m := make(map[string]int64, len(rs))
	for _, r := range rs {
		m[r.Account] = r.Balance
	}
	return m, nil
}
