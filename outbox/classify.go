package outbox

import (
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrorClass says what a store error means for what to do next. The
// ingest loop decides with it whether to retry a transaction soon, stall
// and retry slowly, stop, or blame the item.
type ErrorClass int

// The classes, as Classify assigns them.
const (
	// ClassNone is the class of a nil error.
	ClassNone ErrorClass = iota
	// ClassOther is any error the store does not recognise as an SQLite
	// condition (a commit hook's, a processor's own, a driver's). It is
	// treated as a transient failure: retried soon, then the failure
	// policy.
	ClassOther
	// ClassBusy: SQLITE_BUSY, SQLITE_LOCKED or SQLITE_PROTOCOL. Another
	// connection held the lock past the busy timeout (another process on
	// the file, a checkpoint), or a WAL lock race was lost. It passes by
	// itself: retry soon.
	ClassBusy
	// ClassFull: SQLITE_FULL. The disk (or the database's page limit) is
	// full. Nothing the loop does frees space: stall and retry slowly until
	// an operator does.
	ClassFull
	// ClassIO: SQLITE_IOERR (every extended code but the ones below) or
	// SQLITE_NOMEM. The operating system refused a read, write or sync, or
	// memory ran out. It may be a passing fault or a dying disk: stall and
	// retry slowly; the error stays visible meanwhile.
	ClassIO
	// ClassReadOnly: SQLITE_READONLY, SQLITE_PERM, SQLITE_AUTH or
	// SQLITE_CANTOPEN. The file, its directory or its file system does not
	// take writes (a read-only mount, an immutable file, changed
	// permissions), or a file SQLite needs cannot be opened. An operator can
	// fix it: stall and retry slowly.
	ClassReadOnly
	// ClassMoved: SQLITE_READONLY_DBMOVED. The database file was renamed
	// or deleted under the open connection: every later write would go to
	// a file nobody will open again. Stop loudly.
	ClassMoved
	// ClassCorrupt: SQLITE_CORRUPT or SQLITE_NOTADB. The file is damaged or
	// not a database. Writing on would spread the damage: stop loudly.
	ClassCorrupt
	// ClassConstraint: SQLITE_CONSTRAINT. A write broke a rule of the
	// schema (a unique key, a foreign key, a CHECK). The same writes break
	// it again on every retry: it is the fault of the item that made them,
	// to be dead-lettered, not a reason to retry the commit.
	ClassConstraint
	// ClassFenced: ErrFenced. Another process claimed the database: this
	// one must stop writing.
	ClassFenced
)

// Classify returns err's class, from the first SQLite error in its chain
// (or ErrFenced).
func Classify(err error) ErrorClass {
	if err == nil {
		return ClassNone
	}
	if errors.Is(err, ErrFenced) {
		return ClassFenced
	}
	if errors.Is(err, ErrNotText) {
		return ClassConstraint
	}
	if c, ok := classifyPG(err); ok {
		return c
	}
	code, ok := SQLiteCode(err)
	if !ok {
		return ClassOther
	}
	if code == sqlite3.SQLITE_READONLY_DBMOVED {
		return ClassMoved
	}
	switch code & 0xff { // the primary code of an extended one
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL:
		return ClassBusy
	case sqlite3.SQLITE_FULL:
		return ClassFull
	case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOMEM:
		return ClassIO
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH, sqlite3.SQLITE_CANTOPEN:
		return ClassReadOnly
	case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
		return ClassCorrupt
	case sqlite3.SQLITE_CONSTRAINT:
		return ClassConstraint
	}
	return ClassOther
}

// SQLiteCode returns the (extended) result code of the first SQLite error
// in err's chain: a *sqlite.Error of the driver, or any error of the chain
// that reports an SQLite result code with a Code method.
func SQLiteCode(err error) (int, bool) {
	var coded interface{ Code() int }
	if !errors.As(err, &coded) {
		return 0, false
	}
	return coded.Code(), true
}

// The driver's errors are what SQLiteCode reads.
var _ interface{ Code() int } = (*sqlite.Error)(nil)

// Fatal reports whether the class ends the writer for good: a corrupt or
// moved database, or another process owning it. Retrying cannot help.
func (c ErrorClass) Fatal() bool {
	return c == ClassCorrupt || c == ClassMoved || c == ClassFenced
}

// Lasting reports whether the class is a condition of the database or its
// disk that outlasts quick retries (full, I/O, read-only): the writer
// stalls and retries slowly until an operator removes the cause.
func (c ErrorClass) Lasting() bool {
	return c == ClassFull || c == ClassIO || c == ClassReadOnly
}

// Store reports whether an error of this class is the store's, not the
// item's that was being applied when it came: every class but none,
// other and constraint.
func (c ErrorClass) Store() bool {
	return c != ClassNone && c != ClassOther && c != ClassConstraint
}

// String names the condition for people: it heads the reason a stalled
// feed shows.
func (c ErrorClass) String() string {
	switch c {
	case ClassNone:
		return "no error"
	case ClassBusy:
		return "database busy"
	case ClassFull:
		return "disk full"
	case ClassIO:
		return "disk I/O error"
	case ClassReadOnly:
		return "database not writable"
	case ClassMoved:
		return "database file moved or deleted"
	case ClassCorrupt:
		return "database corrupt"
	case ClassConstraint:
		return "constraint violated"
	case ClassFenced:
		return "database claimed by another process"
	}
	return "store error"
}
