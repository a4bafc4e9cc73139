package outbox

import (
	"context"
	"errors"
	"fmt"

	"modernc.org/sqlite"
)

// AuthRequest is one operation SQLite asks leave for while it compiles a
// statement (see https://www.sqlite.org/c3ref/set_authorizer.html): Action
// with its two arguments (for a write, Arg1 is the table), the database
// ("main", "temp"), and the trigger or view whose body is being compiled
// ("" for the statement's own text).
type AuthRequest struct {
	Action     sqlite.AuthorizerActionCode
	Arg1, Arg2 string
	Database   string
	Inside     string
}

// SetAuthorizer makes allow the judge of every statement compiled on the
// writer connection from now on, the store's own included; nil removes it.
// SQLite consults it while compiling, not while running, and again when
// it compiles a statement anew after a schema change; a statement it
// refuses fails with SQLITE_AUTH. allow must not use the store.
//
// SetAuthorizer waits for the writer connection, so it must not be called
// while a Tx is open. It holds for the connection's life: a writer
// connection the pool had to replace (it never does unless the driver
// reports it broken) would have none.
func (s *Store) SetAuthorizer(ctx context.Context, allow func(AuthRequest) bool) error {
	if s.pg {
		return ErrSQLiteOnly
	}
	var fn sqlite.AuthorizerFn
	if allow != nil {
		fn = func(action sqlite.AuthorizerActionCode, arg1, arg2, db, inside string) sqlite.AuthorizerReturnCode {
			if allow(AuthRequest{Action: action, Arg1: arg1, Arg2: arg2, Database: db, Inside: inside}) {
				return sqlite.AuthorizerOK
			}
			return sqlite.AuthorizerDeny
		}
	}
	return s.rawWriter(ctx, func(dc any) error {
		r, ok := dc.(sqlite.AuthorizerRegisterer)
		if !ok {
			return errors.New("the SQLite driver has no authorizer")
		}
		return r.RegisterAuthorizer(fn)
	})
}

// ColumnNames compiles query on the writer connection, without running it,
// and returns the names of its result columns (none for a statement that
// returns no rows). It waits for the writer connection, so it must not be
// called while a Tx is open.
func (s *Store) ColumnNames(ctx context.Context, query string) ([]string, error) {
	var names []string
	err := s.rawWriter(ctx, func(dc any) error {
		ci, ok := dc.(interface {
			ColumnInfo(query string) ([]sqlite.ColumnInfo, error)
		})
		if !ok {
			return errors.New("the SQLite driver does not describe columns")
		}
		info, err := ci.ColumnInfo(query)
		if err != nil {
			return err
		}
		for _, c := range info {
			names = append(names, c.Name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("columns of %q: %w", firstLine(query), err)
	}
	return names, nil
}

// rawWriter runs f with the writer connection's driver connection.
func (s *Store) rawWriter(ctx context.Context, f func(driverConn any) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("writer connection: %w", err)
	}
	defer conn.Close()
	return conn.Raw(f)
}
