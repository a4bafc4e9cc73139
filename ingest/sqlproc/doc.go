// Package sqlproc is the SQL processor: a processor declared in the
// configuration, whose state is tables of outboxd's database and whose
// logic is SQL run inside the item's own savepoint, so its writes, its
// outputs and the feed's position commit together, exactly once.
//
// # Statements
//
// A Config holds four kinds of SQL:
//   - setup: any number of statements, run when the processor starts, in
//     the loop's setup transaction (CREATE TABLE IF NOT EXISTS ...). They
//     take no parameters.
//   - reject: one query, run first for each item. A row returned makes the
//     item a dead letter: the row's first column is the reason ("malformed";
//     NULL or empty gives "rejected"), its second, if there is one, the
//     error. No row: the item goes on.
//   - apply: any number of statements, run in order: the state's changes.
//   - emit: one query run last, a SELECT or a statement with RETURNING:
//     each row is one output.
//
// Besides, Migrations change the tables once each, in version order,
// after setup (see Migration); Window makes apply run per open window of
// the item's event time and emit once per window when the watermark
// passes its end (see Window); Reads lets the statements read, never
// write, other feeds' processors' tables (see ReadSource).
//
// Statements are cut like sqlite3_complete does: a ";" inside a string, a
// quoted name, a comment or the body of CREATE TRIGGER ... BEGIN ... END
// ends nothing. Each is compiled once and kept prepared.
//
// # Parameters
//
// A statement names the parameters it uses as :name (or @name, $name); it
// may use any of them, and naming one that does not exist is an error at
// load. Positional parameters (?, ?1) are refused. From the item's
// Delivery:
//
//	:feed       TEXT     the feed's name
//	:partition  INTEGER  0 for a file
//	:topic      TEXT     the Kafka topic the item was read from; NULL for a file
//	:epoch      TEXT     the source's position space
//	:position   INTEGER  the position after the item (a file's byte offset after the line)
//	:sequence   INTEGER  this run's count of deliveries, from 1 (restarts with every run)
//	:attempt    INTEGER  1, then 2, 3, ... when the item is retried
//	:key        TEXT     the record's key (a BLOB when it is not UTF-8); NULL when none
//	:value      TEXT     the line or the record's value (a BLOB when not UTF-8; NULL for a tombstone)
//	:headers    TEXT     the record's headers as a JSON object of strings ({} when none;
//	                     of a repeated key the last value stands; bytes that are not UTF-8
//	                     become U+FFFD)
//
// and one per decoded field, by its name:
//   - input "csv": one per Columns entry. A record with another number of
//     fields is malformed. Fields are separated by Delimiter (","), quoted
//     as RFC 4180 says unless Quoting is "none", and trimmed of Unicode white
//     space when Trim is set. An unquoted field that strconv.ParseInt reads
//     in base 10 ("-7", "+7", "007") binds as INTEGER; any other field, a
//     quoted one, or one of a Text column binds as TEXT, or as a BLOB when
//     it is not UTF-8 (no byte is replaced). So typeof(:amount) <> 'integer'
//     tells a malformed amount.
//   - input "json": one per Fields entry, a path into the document ("$.a.b",
//     "a.b", "$.a[0]", `$["odd key"]`). A string binds as TEXT, an integer
//     that fits 64 bits as INTEGER, another number as REAL, true and false
//     as 1 and 0, null as NULL, an object or array as its compact JSON text;
//     a path that leads nowhere binds NULL, or makes the item malformed if
//     the field is Required. A value that is not JSON is malformed.
//   - input "raw": nothing is decoded; statements read :value.
//
// # Outputs
//
// The emit statement's columns are named (AS), not placed: topic, key and
// value, and optionally headers; another column is an error at load, and so
// is a missing key or value, or a missing topic when Config.Topic gives no
// default. Per row: topic TEXT, or NULL for the default topic; key and
// value TEXT or BLOB as they are, INTEGER as its decimal digits, NULL for
// none (a NULL value is a Kafka tombstone), REAL refused (CAST it, its text
// would depend on formatting); headers NULL or a JSON object of string
// values, in its order. Rows are emitted in the order the query returns
// them.
//
// # Errors
//
// The engine's rules apply: a permanent error makes the item a dead letter
// at once, with its reason; any other is retried, then handled by the
// feed's failure policy. Permanent:
//   - input that does not decode: "malformed";
//   - a reject row: its reason;
//   - a broken constraint (UNIQUE, NOT NULL, CHECK, FOREIGN KEY, a STRICT
//     column's type, RAISE(ABORT) or RAISE(FAIL)): "constraint";
//   - a statement that cannot run on the item's values (malformed JSON
//     given to a JSON function, an integer overflow): "sql-error";
//   - a statement the guard refuses at run time: "forbidden";
//   - an emit row that is not an output: "bad-output".
//
// Transient: everything else (a lock, a full disk, an I/O error, the
// attempt's deadline, which interrupts a statement still running). An
// item's writes are undone whenever it fails.
//
// # What user SQL may not do
//
// User SQL may read outboxd's tables, never write them. New runs Check:
// every statement is compiled against a scratch database holding outboxd's
// schema and what the setup made, under SQLite's authorizer, which refuses
// a write to, or the creation, alteration or removal of, outboxd's tables
// and SQLite's own (sqlite_sequence, sqlite_stat*, sqlite_dbpage), directly
// or from a trigger or view the statement fires; a trigger on outboxd's
// tables; a temporary table named like one of them; transaction control
// (BEGIN, COMMIT, SAVEPOINT, RELEASE), which is outboxd's; ATTACH and
// DETACH; pragmas other than those that describe the schema; ANALYZE; and
// extension loading. A conflict resolution or RAISE that is ROLLBACK, which
// would end outboxd's transaction rather than the statement, is refused as
// written. At run time, Guard keeps an authorizer on the store's writer
// connection that refuses what the real database's schema could still
// bring: a trigger that is not outboxd's writing outboxd's tables, a
// trigger on them, a temporary object hiding them. Its limit: it binds
// SQL compiled on that connection, not a person with the database file and
// the sqlite3 shell.
package sqlproc
