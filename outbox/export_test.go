package outbox

import "github.com/jmoiron/sqlx"

// WriterOf is s's writer connection, for the store's own tests of its
// pragmas, pools and migrations. It is a function, not a method, so that
// the Store's method set, which TestStore_NoHandle checks, stays the
// shipped one.
func WriterOf(s *Store) *sqlx.DB { return s.db }

// ReadPoolOf is s's read-only pool, for the same tests.
func ReadPoolOf(s *Store) *sqlx.DB { return s.rdb }

// MaxRecentBytes and CachedRowOverhead are the recent rows cache's byte
// bound and what it counts for a row beyond its key, value and headers.
const (
	MaxRecentBytes    = maxRecentBytes
	CachedRowOverhead = cachedRowOverhead
)

// KeptDriverStmts is the number of statements Tx.Batch keeps prepared on
// the writer's driver connection, and the most it keeps.
func KeptDriverStmts(s *Store) (n, most int) { return len(s.drv.stmts), maxKeptStmts }

// KeptDriverStmt is the statement Tx.Batch keeps prepared for query, nil
// when it keeps none.
func KeptDriverStmt(s *Store, query string) any {
	if st, ok := s.drv.stmts[query]; ok {
		return st
	}
	return nil
}
