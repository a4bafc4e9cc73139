package sqlproc

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// errWrongStore says a processor runs on a store of the other engine: its
// SQL is written for one (New: SQLite's, NewPostgres: PostgreSQL's).
var errWrongStore = errors.New("its SQL is for the other database engine: sqlproc.New's runs on SQLite, sqlproc.NewPostgres's on PostgreSQL")

// pgMessage is PostgreSQL's message of err on one line, with its SQLSTATE.
func pgMessage(err error) string {
	var pe *pgconn.PgError
	msg := err.Error()
	if errors.As(err, &pe) {
		msg = pe.Message + " (SQLSTATE " + pe.Code + ")"
	}
	return strings.Join(strings.Fields(msg), " ")
}

// pgText readies the bound item's values for PostgreSQL, where a
// parameter has one type per statement, given by its use (a column it is
// compared with or stored in, a CAST): an integer or a real is bound as
// its text, which PostgreSQL reads as that type (pgx sends a string in
// text format), so :amount serves a bigint column and CAST(:amount AS
// text) alike. It refuses an item whose decoded values PostgreSQL's text
// cannot hold: bytes that are not UTF-8 (SQLite binds them as a BLOB) or
// a NUL; as for the built-in processors on PostgreSQL, such an item is
// malformed. :key and :value stay bytes when they are not UTF-8.
func (s *itemState) pgText() error {
	for i, v := range s.vals {
		switch v := v.(type) {
		case int64:
			s.vals[i] = strconv.FormatInt(v, 10)
		case float64:
			s.vals[i] = strconv.FormatFloat(v, 'g', -1, 64)
		case []byte:
			if i >= nDeliverySlots {
				return fmt.Errorf("parameter :%s is not UTF-8 text, which PostgreSQL's text cannot hold", s.p.plan.params[i])
			}
		case string:
			if i >= nDeliverySlots && strings.IndexByte(v, 0) >= 0 {
				return fmt.Errorf("parameter :%s holds a NUL byte, which PostgreSQL's text cannot hold", s.p.plan.params[i])
			}
		}
	}
	return nil
}

// isPG reports whether err is PostgreSQL's.
func isPG(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe)
}
