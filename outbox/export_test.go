package outbox

import "github.com/jmoiron/sqlx"

// DB is the writer connection, for the store's own tests of its pragmas,
// pools and migrations.
func (s *Store) DB() *sqlx.DB { return s.db }

// ReadDB is the read-only pool, for the same tests.
func (s *Store) ReadDB() *sqlx.DB { return s.rdb }
