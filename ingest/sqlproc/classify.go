package sqlproc

import (
	"strings"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Reasons of the dead letters a SQL processor makes, besides the reasons
// its reject statement returns and ingest.ReasonMalformed for input that
// does not decode.
const (
	// ReasonConstraint: a statement broke a constraint (UNIQUE, NOT NULL,
	// CHECK, FOREIGN KEY, a STRICT column's type, RAISE(ABORT) or
	// RAISE(FAIL) in a trigger).
	ReasonConstraint = "constraint"
	// ReasonSQLError: a statement failed on this item's values (a bad JSON
	// argument to a JSON function, an integer overflow, a string too big).
	ReasonSQLError = "sql-error"
	// ReasonForbidden: the guard refused a statement (a trigger it fires
	// writes outboxd's tables).
	ReasonForbidden = "forbidden"
	// ReasonBadOutput: an emit row is not an output (a NULL topic with no
	// default topic, a REAL value, headers that are not a JSON object of
	// strings).
	ReasonBadOutput = "bad-output"
	// ReasonRejected: a reject row whose reason is NULL or empty.
	ReasonRejected = "rejected"
)

// classify tells what a statement's error means for the item, by SQLite's
// primary result code:
//   - SQLITE_CONSTRAINT: the item breaks the state's rules; no retry
//     changes that: permanent, ReasonConstraint.
//   - SQLITE_ERROR, SQLITE_MISMATCH, SQLITE_RANGE, SQLITE_TOOBIG: the
//     statement cannot run on these values (statements are compiled and
//     checked at start, so what fails now is data): permanent,
//     ReasonSQLError, or ReasonForbidden when the guard refused it.
//   - SQLITE_AUTH: the guard refused it: permanent, ReasonForbidden.
//   - everything else (SQLITE_BUSY and SQLITE_LOCKED: a lock another
//     connection holds; SQLITE_IOERR, SQLITE_FULL, SQLITE_NOMEM,
//     SQLITE_CANTOPEN: the machine; SQLITE_INTERRUPT and context errors: the
//     attempt's time ran out; SQLITE_CORRUPT, SQLITE_READONLY, ...: the
//     database, which an operator must see, not each item dead-lettered)
//     and errors that are not SQLite's: transient, returned as they are
//     so the loop retries the item.
//
// The store's shared classifier (outbox.Classify) says which errors are
// SQLite's and which are broken constraints; the codes it leaves as
// ClassOther or ClassReadOnly are told apart here, since for user SQL an
// SQLITE_ERROR is the item's values and an SQLITE_AUTH the guard's refusal.
func classify(err error) error {
	class := outbox.Classify(err)
	if class == outbox.ClassConstraint {
		return ingest.Permanent(ReasonConstraint, err)
	}
	code, ok := outbox.SQLiteCode(err)
	if !ok {
		return err
	}
	switch code & 0xff {
	case sqlite3.SQLITE_AUTH:
		return ingest.Permanent(ReasonForbidden, err)
	case sqlite3.SQLITE_ERROR, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE, sqlite3.SQLITE_TOOBIG:
		if strings.Contains(err.Error(), "not authorized") {
			return ingest.Permanent(ReasonForbidden, err)
		}
		return ingest.Permanent(ReasonSQLError, err)
	}
	return err
}
