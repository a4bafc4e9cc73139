package outbox

// The store on PostgreSQL.
//
// The engine is chosen by Config.Path: a postgres:// or postgresql:// URL
// opens PostgreSQL (IsPostgres), anything else is a SQLite file, the
// default. Both are the one Store type: what they share is every method's
// logic and nearly all of its SQL; what differs is behind a few methods
// (this file and the other pg_*.go): opening and migrating (schema_pg.sql,
// the same numbered steps), the driver (pgx's database/sql driver wrapped
// by pgConn, which binds SQLite's ? and ?N placeholders as $N and swaps
// the statements whose dialect differs for their PostgreSQL text,
// pgDialect), the probe of a lost transaction, the error classes, and
// what has no meaning on a server (the file's identity, the WAL).
//
// A Tx is one PostgreSQL transaction (READ COMMITTED) on the store's one
// writer connection: state, positions, stats and outbox rows commit
// together, and each item has its SAVEPOINT as on SQLite. A statement that
// fails outside an item's savepoint aborts the whole transaction on
// PostgreSQL, so it is lost (ErrTxLost) at once. Outbox ids follow commit
// order because every commit that writes outputs reads outbox_ids FOR
// UPDATE: the row lock is held until COMMIT, so a second writer (another
// process, before Claim fences it) waits, then assigns the ids after the
// first's; a sequence would hand out ids in call order, not commit order,
// and a relay that has seen every id <= N could then miss one committed
// later below N. The owner check reads the claim FOR SHARE in the same
// transaction: a Claim's update waits for the commit in flight, and a
// commit after the Claim sees the new generation and fails with ErrFenced.
// The outbox's fast path is SQLite's: chunks of up to 64 outputs, 16
// chunks a multi-row INSERT prepared once on the connection.
//
// The per-partition owner epoch of a consumer group feed is one more row
// read FOR SHARE in the batch transaction, beside the claim (partowner.go).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/outboxd/outboxd"
)

// ErrSQLiteOnly is returned, on a PostgreSQL store, by what only the
// SQLite engine has yet: the SQL processors' guard, built on SQLite's
// authorizer. (State queries run on both: pg_query.go.)
var ErrSQLiteOnly = errors.New("runs on a SQLite --db only in this version (it is checked by SQLite's authorizer)")

// IsPostgres reports whether db names a PostgreSQL database (a
// postgres:// or postgresql:// URL) rather than a SQLite file.
func IsPostgres(db string) bool {
	l := strings.ToLower(db)
	return strings.HasPrefix(l, "postgres://") || strings.HasPrefix(l, "postgresql://")
}

// Postgres reports whether the store's engine is PostgreSQL.
func (s *Store) Postgres() bool { return s.pg }

// openPG opens and migrates the PostgreSQL database cfg.Path names.
func openPG(ctx context.Context, cfg Config) (*Store, error) {
	s := &Store{cfg: cfg, pg: true, stmts: map[string]*sqlx.Stmt{}, committed: make(chan struct{}, 1)}
	s.pack.never = true // the outbox view decodes raw bodies only (pg_view.go)
	var err error
	if s.db, err = pgPool(cfg.Path, false, cfg.IdleInTxTimeout); err != nil {
		return nil, err
	}
	s.db.SetMaxOpenConns(1)
	s.db.SetMaxIdleConns(1)
	if err := s.db.PingContext(ctx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("open %s: %w", redactDSN(cfg.Path), err)
	}
	if err := s.migratePG(ctx); err != nil {
		s.db.Close()
		return nil, err
	}
	if s.rdb, err = pgPool(cfg.Path, true, 0); err != nil {
		s.db.Close()
		return nil, err
	}
	s.rdb.SetMaxOpenConns(4)
	s.rdb.SetMaxIdleConns(4)
	if err := s.openMeter(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// pgPool is a pool of connections to dsn through pgConn; a read-only
// pool's transactions refuse writes, as SQLite's query_only readers do.
// idle, when not 0, is the sessions' idle_in_transaction_session_timeout
// (see Config.IdleInTxTimeout).
func pgPool(dsn string, readOnly bool, idle time.Duration) (*sqlx.DB, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", redactDSN(dsn), err)
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = "outboxd"
	if readOnly {
		cc.RuntimeParams["default_transaction_read_only"] = "on"
	}
	// A context's end cancels the statement on the server (a cancel
	// request), as sqlite3_interrupt ends SQLite's: the connection, and so
	// the batch's transaction, stand, and only the item's savepoint is
	// rolled back. pgx's default closes the connection, which loses the
	// transaction. Past pgCancelGrace without the server's answer the
	// connection is closed all the same.
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: pgCancelGrace}
	}
	if idle > 0 {
		cc.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(idle.Milliseconds(), 10)
	}
	return sqlx.NewDb(sql.OpenDB(pgConnector{stdlib.GetConnector(*cc)}), "pgx"), nil
}

// pgCancelGrace is how long a canceled statement's connection waits for
// the server to answer the cancel request before it is closed.
const pgCancelGrace = 5 * time.Second

// redactDSN is dsn without its password, for messages.
func redactDSN(dsn string) string {
	cc, err := pgconn.ParseConfig(dsn)
	if err != nil || cc.Password == "" {
		return dsn
	}
	return strings.Replace(dsn, ":"+cc.Password+"@", ":xxxxx@", 1)
}

// pgSchemaTable keeps the schema version PostgreSQL has no PRAGMA for.
const pgSchemaTable = `CREATE TABLE IF NOT EXISTS outboxd_schema (version BIGINT NOT NULL)`

// pgMigrateLock is the advisory lock the migrations run under, so servers
// opening one new database at once apply each migration once.
const pgMigrateLock = `SELECT pg_advisory_xact_lock(7302411)`

// migratePG applies the migrations the database lacks, all in one
// transaction (PostgreSQL's DDL is transactional).
func (s *Store) migratePG(ctx context.Context) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	for _, q := range []string{pgMigrateLock, pgSchemaTable} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	var versions []int
	if err := tx.SelectContext(ctx, &versions, `SELECT version FROM outboxd_schema`); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	version := 0
	if len(versions) == 0 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO outboxd_schema VALUES (0)`); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	} else {
		version = versions[0]
	}
	ms := outboxd.PGMigrations()
	if version > len(ms) {
		return fmt.Errorf("database schema version %d is newer than this binary's %d", version, len(ms))
	}
	for _, m := range ms[version:] {
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("migration %d: %w", m.Version, err)
		}
	}
	if _, err := tx.ExecContext(ctx, pgOutboxView); err != nil {
		return fmt.Errorf("migrate: the outbox view: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE outboxd_schema SET version = $1`, len(ms)); err != nil {
		return fmt.Errorf("migrate: set version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}

// pgCode is the SQLSTATE of a PostgreSQL error in err's chain.
func pgCode(err error) (string, bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return "", false
	}
	return pe.Code, true
}

// classifyPG sorts a PostgreSQL error by its SQLSTATE class: a
// serialization failure or deadlock, a lock not available or a refused
// connection is busy (retried); a full disk is full; an integrity
// constraint is the item's; insufficient privileges or a read-only
// transaction is not writable; data corruption is corrupt. A lost
// connection (pgconn's own errors, class 08) is busy: the server may be
// back at the next attempt.
func classifyPG(err error) (ErrorClass, bool) {
	code, ok := pgCode(err)
	if !ok {
		if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
			return ClassBusy, true
		}
		var ce *pgconn.ConnectError
		if errors.As(err, &ce) {
			return ClassBusy, true
		}
		return ClassNone, false
	}
	switch {
	case code == "40001", code == "40P01", code == "55P03", code == "57P03", strings.HasPrefix(code, "08"):
		return ClassBusy, true
	case code == "53100":
		return ClassFull, true
	case strings.HasPrefix(code, "53"), strings.HasPrefix(code, "58"):
		return ClassIO, true
	case strings.HasPrefix(code, "23"), strings.HasPrefix(code, "22"):
		// An integrity constraint, or a data exception: a value the
		// column's type refuses (text that is not UTF-8 or holds a NUL,
		// a number out of range), the item's as a constraint is.
		return ClassConstraint, true
	case code == "42501", code == "25006":
		return ClassReadOnly, true
	case strings.HasPrefix(code, "XX"):
		return ClassCorrupt, true
	}
	return ClassOther, true
}

// probePG is probeFiles on PostgreSQL: the writer's server answers and
// its session may write (not a read-only standby, not a read-only role).
func (s *Store) probePG(ctx context.Context) error {
	var ro string
	if err := s.rdb.GetContext(ctx, &ro, `SELECT current_setting('transaction_read_only') FROM pg_is_in_recovery() AS r WHERE NOT r`); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return errors.New("the PostgreSQL server is a standby in recovery: not writable")
		}
		return fmt.Errorf("probe %s: %w", s.name(), err)
	}
	return nil
}
