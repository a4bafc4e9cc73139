// Package outbox owns outboxd's SQLite database: opening and migrating it,
// the ingest transaction (state, positions, stats and output rows written
// together), and the reads the relay and the API make.
//
// The store promises:
//   - one writer connection (SQLite has one writer anyway), opened in WAL mode
//     with a busy timeout, foreign keys on and synchronous=FULL unless
//     configured otherwise; reads go through a separate read-only pool, so
//     they never wait for a writer;
//   - a Tx is one SQLite transaction: everything written through it, including
//     output rows, commits or vanishes together;
//   - outbox ids are strictly increasing in commit order (AUTOINCREMENT under
//     a single writer), so a reader that has seen every id <= N has seen every
//     row committed before the row with id N.
//
// No database handle leaves the package: every read and write of another
// package is a named method, a processor's SQL runs in a Tx (its writes)
// or a View (its reads outside an item), and other packages' tests use
// outboxtest. So the store's engine and its connections can change behind
// its methods.
package outbox

import (
	"context"
	"crypto/rand"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"modernc.org/sqlite" // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox/internal/handle"
)

// ErrNotFound is returned when a named feed, dead letter or row does not exist.
var ErrNotFound = errors.New("not found")

// SyncMode is SQLite's synchronous setting, as the store opens it.
type SyncMode string

// Synchronous modes accepted by Config.Synchronous.
const (
	SyncFull   SyncMode = "full"   // a commit survives power loss
	SyncNormal SyncMode = "normal" // a commit survives a process crash, not power loss
)

// Config says how to open the store.
type Config struct {
	// Path of the SQLite file. Its directory is created if missing.
	Path string
	// Synchronous is SyncFull (default: a commit survives power loss) or
	// SyncNormal (survives a process crash, not power loss).
	Synchronous SyncMode
	// IdleInTxTimeout, on PostgreSQL, ends the writer's session when its
	// transaction waits that long on this process between statements (0:
	// the server's setting). Servers sharing the database set it: a server
	// paused in the middle of a commit would otherwise hold its row locks
	// (a partition's owner epoch, the outbox ids) for as long as it is
	// paused, and the others' claims and commits would wait with it. Its
	// session ended, the paused server's transaction is rolled back, and
	// its commit fails once it runs again.
	IdleInTxTimeout time.Duration
	// BusyTimeout bounds how long a statement waits for another process's lock.
	BusyTimeout time.Duration
	// Now returns the current time; tests may replace it.
	Now func() time.Time
}

// DefaultConfig returns the defaults for a database at path.
func DefaultConfig(path string) Config {
	return Config{Path: path, Synchronous: SyncFull, BusyTimeout: 5 * time.Second, Now: time.Now}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.Path == "" {
		return errors.New("db: a path is required")
	}
	switch c.Synchronous {
	case SyncFull, SyncNormal:
	default:
		return fmt.Errorf("synchronous: %q is not one of full, normal", c.Synchronous)
	}
	if c.BusyTimeout < 0 {
		return fmt.Errorf("busy timeout: %v is negative", c.BusyTimeout)
	}
	return nil
}

// Store is an open outboxd database. It is safe for concurrent use.
type Store struct {
	cfg Config
	pg  bool     // the engine is PostgreSQL (pg_engine.go), not SQLite
	db  *sqlx.DB // the one writer connection
	rdb *sqlx.DB // read-only pool

	mu    sync.Mutex
	stmts map[string]*sqlx.Stmt // prepared on db, keyed by query

	// committed is signalled (without blocking) after every commit that
	// wrote output rows, so the relay need not poll.
	committed chan struct{}
	commits   commitBroadcast // Commits' channel, for any number of consumers
	recent    recentRows      // rows of the latest commits, see RecentRows
	rowsHint  atomic.Int64    // outputs of the last commit: the next one's first allocation
	backlogs  feedBacklogs    // the last backlog scan of each feed
	meter     backlogMeter    // the whole outbox's backlog, see PendingBacklog
	consumers consumers       // whose progress the backlog and pruning count

	hookMu     sync.Mutex
	commitHook func(ctx context.Context) error

	owner atomic.Int64 // generation taken by Claim; 0 = unclaimed
	// parts holds the group feeds' partitions this store took (see
	// partowner.go); grouped is set once it has a group feed.
	parts   partOwners
	grouped atomic.Bool
	shared  atomic.Bool  // set by Share
	claims  atomic.Int64 // ClaimPartition calls that succeeded

	queries  queryConns    // the state queries' own connections, see QueryConns
	drv      driverStmts   // statements prepared by Tx.Batch
	drvSpill []driver.Stmt // prepared past drv's room, closed as the Batch call ends
	watch    deadlineWatch // binds Batch's statements to their contexts (SQLite)
	// flushArgs is the writer's buffer of an outbox insert's arguments,
	// flushBody and flushSpans those of a commit's chunks (see flushRows).
	flushArgs  []driver.NamedValue
	flushBody  []byte
	flushSpans []chunkSpan
	pack       compressor

	health writeHealth // how the writes went, for CheckWritable
	closed atomic.Bool // set by Close
	files  openedFiles // the files opened at the path, see CheckPath
}

// Open opens (creating if needed) and migrates the database.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Synchronous == "" {
		cfg.Synchronous = SyncFull
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if IsPostgres(cfg.Path) {
		return openPG(ctx, cfg)
	}
	if dir := filepath.Dir(cfg.Path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create database directory: %w", err)
		}
	}
	if err := initPageSize(ctx, cfg.Path); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, stmts: map[string]*sqlx.Stmt{}, committed: make(chan struct{}, 1)}
	var err error
	if s.db, err = sqlx.Open("sqlite", s.dsn(false)); err != nil {
		return nil, fmt.Errorf("open %s: %w", cfg.Path, err)
	}
	s.db.SetMaxOpenConns(1)
	s.db.SetMaxIdleConns(1)
	s.db.SetConnMaxLifetime(0)
	s.db.SetConnMaxIdleTime(0)
	if err := s.connect(ctx); err != nil {
		s.db.Close()
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		s.db.Close()
		return nil, err
	}
	if err := s.recordFiles(); err != nil {
		s.db.Close()
		return nil, err
	}
	if s.rdb, err = sqlx.Open("sqlite", s.dsn(true)); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("open %s for reading: %w", cfg.Path, err)
	}
	s.rdb.SetMaxOpenConns(4)
	// Kept open: database/sql keeps 2 idle by default, and each reopened
	// connection parses the schema again.
	s.rdb.SetMaxIdleConns(4)
	if err := s.openMeter(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// openMeter starts the backlog meter from the last id written and the
// last published (by any relay id: a database has one).
func (s *Store) openMeter(ctx context.Context) error {
	last, err := lastOutboxID(ctx, s.rdb)
	if err != nil {
		return err
	}
	var published int64
	if err := s.rdb.GetContext(ctx, &published, `SELECT coalesce(max(last_id), 0) FROM relay_progress`); err != nil {
		return fmt.Errorf("read relay progress: %w", err)
	}
	s.meter.opened(last, published)
	s.consumers.relayAt = published
	return nil
}

func (s *Store) dsn(readOnly bool) string {
	if readOnly {
		return dsn(s.cfg, "_pragma=query_only(1)")
	}
	return DSN(s.cfg)
}

// WriterCacheKiB is the page cache of the writer connection, in KiB. The
// writer touches the state's pages at random: a cache that holds the pages
// of about a million keys saves reading them back on every batch, and
// SQLite allocates it only as pages are used. 32 MiB keeps the server's
// peak RSS within 256 MiB at ten million keys. It is outside Go's heap, so it does
// not move the garbage collector's target. Readers keep SQLite's default
// (2 MiB each).
const WriterCacheKiB = 32 << 10

// DSN is the data source name the store opens its one writer connection
// with: WAL, the busy timeout, foreign keys, cfg's synchronous mode, BEGIN
// IMMEDIATE, the writer's page cache, a checkpoint when the WAL reaches
// about 4 MiB (walBytes) and in-memory statement journals. A
// tool that must write exactly as the store does (Ceiling, the bench's)
// opens its connection with it.
func DSN(cfg Config) string {
	if cfg.BusyTimeout == 0 {
		cfg.BusyTimeout = DefaultConfig(cfg.Path).BusyTimeout
	}
	if cfg.Synchronous == "" {
		cfg.Synchronous = SyncFull
	}
	return dsn(cfg,
		fmt.Sprintf("_pragma=cache_size(-%d)", WriterCacheKiB),
		fmt.Sprintf("_pragma=wal_autocheckpoint(%d)", walCheckpointPages(cfg.Path)),
		// BEGIN IMMEDIATE: take the write lock at BEGIN, so a transaction
		// never fails half-way with SQLITE_BUSY on its first write.
		"_txlock=immediate")
}

// dsn is the DSN every connection shares, plus extra parameters.
func dsn(cfg Config, extra ...string) string {
	p := []string{
		fmt.Sprintf("_pragma=busy_timeout(%d)", cfg.BusyTimeout.Milliseconds()),
		"_pragma=journal_mode(wal)",
		"_pragma=synchronous(" + string(cfg.Synchronous) + ")",
		"_pragma=foreign_keys(on)",
		// A multi-row upsert that touches many pages journals each of them
		// for its statement; past 64 KiB SQLite spills that journal to a
		// temporary file, a write system call per page. In memory it is a
		// copy.
		"_pragma=temp_store(memory)",
	}
	p = append(p, extra...)
	return "file:" + uriPath.Replace(cfg.Path) + "?" + strings.Join(p, "&")
}

// uriPath escapes the characters that would end a file: URI's path.
var uriPath = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")

// connect makes the writer connection and checks it is in WAL mode. A
// connection's set-up can fail at once with SQLITE_BUSY, without waiting
// for the busy timeout, when other processes open the same new database at
// the same moment (SQLite refuses a lock upgrade that could deadlock): it is
// tried again until the busy timeout has passed.
func (s *Store) connect(ctx context.Context) error {
	deadline := time.Now().Add(s.cfg.BusyTimeout)
	for {
		err := s.checkWAL(ctx)
		if err == nil || !isBusy(err) || time.Now().After(deadline) {
			return err
		}
		if clock.Sleep(ctx, 10*time.Millisecond) != nil {
			return err
		}
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED
// (any extended code of either).
func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	code := se.Code() & 0xff
	return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
}

func (s *Store) checkWAL(ctx context.Context) error {
	var mode string
	if err := s.db.GetContext(ctx, &mode, "PRAGMA journal_mode"); err != nil {
		return fmt.Errorf("open %s: %w", s.cfg.Path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("open %s: journal_mode is %q, want wal", s.cfg.Path, mode)
	}
	return nil
}

// migrate applies the migrations the database lacks. Each runs in a write
// transaction that reads the schema version first, so processes opening
// the same new database at once apply each migration once.
func (s *Store) migrate(ctx context.Context) error {
	var version int
	if err := s.db.GetContext(ctx, &version, "PRAGMA user_version"); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if version == len(outboxd.Migrations()) {
		return nil // up to date: no write lock needed to open
	}
	for _, m := range outboxd.Migrations() {
		if err := s.applyMigration(ctx, m, len(outboxd.Migrations())); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) applyMigration(ctx context.Context, m outboxd.Migration, latest int) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d: %w", m.Version, err)
	}
	defer tx.Rollback()
	var version int
	if err := tx.GetContext(ctx, &version, "PRAGMA user_version"); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if version > latest {
		return fmt.Errorf("database schema version %d is newer than this binary's %d", version, latest)
	}
	if version >= m.Version {
		return nil
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return fmt.Errorf("migration %d: %w", m.Version, err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.Version)); err != nil {
		return fmt.Errorf("migration %d: set version: %w", m.Version, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d: commit: %w", m.Version, err)
	}
	return nil
}

// Close closes both pools. When the path no longer names the database
// (CheckPath: deleted or replaced), it first moves the write-ahead log
// into the database file it has open and empties the log: SQLite leaves
// the log of a moved database in place, and a process opening the path
// later would replay it onto whatever file is there now.
func (s *Store) Close() error {
	s.closed.Store(true)
	if !s.pg && errors.Is(s.CheckPath(), ErrMoved) {
		s.emptyWAL()
	}
	s.mu.Lock()
	for _, st := range s.stmts {
		st.Close()
	}
	s.stmts = map[string]*sqlx.Stmt{}
	s.mu.Unlock()
	s.closeDriverStmts(context.Background())
	s.watch.close()
	rerr := errors.Join(s.closeQueryConns(), s.rdb.Close())
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close %s: %w", s.name(), err)
	}
	if rerr != nil {
		return fmt.Errorf("close %s (readers): %w", s.name(), rerr)
	}
	return nil
}

// Path is the database file's path (a PostgreSQL store's URL).
func (s *Store) Path() string { return s.cfg.Path }

// name is the database as messages name it: its path, or its URL without
// the password.
func (s *Store) name() string {
	if s.pg {
		return redactDSN(s.cfg.Path)
	}
	return s.cfg.Path
}

// Synchronous is the synchronous mode the store was opened with.
func (s *Store) Synchronous() SyncMode { return s.cfg.Synchronous }

// Now is the store's clock.
func (s *Store) Now() time.Time { return s.cfg.Now() }

// The writer connection reaches tests through outboxtest only.
func init() { handle.Writer = func(s any) *sqlx.DB { return s.(*Store).db } }

// Committed is signalled after each commit that wrote output rows. It has a
// buffer of one and is meant for a single consumer (the relay).
func (s *Store) Committed() <-chan struct{} { return s.committed }

// SetCommitHook installs a function run just before every COMMIT of a Tx;
// when it returns an error the transaction is rolled back and Commit returns
// that error. It is the seam through which tests inject completion failures
// into a real SQLite store. nil removes the hook.
func (s *Store) SetCommitHook(h func(ctx context.Context) error) {
	s.hookMu.Lock()
	s.commitHook = h
	s.hookMu.Unlock()
}

func (s *Store) hook() func(ctx context.Context) error {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	return s.commitHook
}

// prepared returns a statement prepared once on the writer connection.
func (s *Store) prepared(ctx context.Context, query string) (*sqlx.Stmt, error) {
	if st := s.keptStmt(query); st != nil {
		return st, nil
	}
	// Not under s.mu: preparing waits for the writer connection, and a
	// transaction holding it may need s.mu to look up its statements.
	st, err := s.db.PreparexContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", firstLine(query), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if kept, ok := s.stmts[query]; ok {
		st.Close()
		return kept, nil
	}
	s.stmts[query] = st
	return st, nil
}

// maxKeptStmts bounds the statements the store keeps prepared for
// transactions: a processor building queries of ever new shapes prepares
// them per transaction instead of growing the cache without end.
const maxKeptStmts = 256

// keptStmt is the statement the store keeps prepared for query, nil if none.
func (s *Store) keptStmt(query string) *sqlx.Stmt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stmts[query]
}

// keepStmts prepares queries on the writer connection, for the transactions
// to come, while the cache has room. A failure only means the next
// transaction prepares the query itself, so it is logged, not returned.
func (s *Store) keepStmts(ctx context.Context, queries []string) {
	for _, q := range queries {
		s.mu.Lock()
		full := len(s.stmts) >= maxKeptStmts
		s.mu.Unlock()
		if full {
			return
		}
		if _, err := s.prepared(ctx, q); err != nil {
			slog.Warn("keep statement prepared", "err", err)
		}
	}
}

func firstLine(q string) string {
	q = strings.TrimSpace(q)
	if i := strings.IndexByte(q, '\n'); i >= 0 {
		return q[:i] + " ..."
	}
	return q
}

// MetaID returns the random id stored under key, generating and storing it
// the first time. The relay's default transactional id derives from one.
func (s *Store) MetaID(ctx context.Context, key string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate %s: %w", key, err)
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO NOTHING`,
		key, hex.EncodeToString(b[:])); err != nil {
		return "", fmt.Errorf("store %s: %w", key, err)
	}
	var v string
	if err := s.db.GetContext(ctx, &v, `SELECT value FROM meta WHERE key = ?`, key); err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	return v, nil
}

// IntegrityCheck runs PRAGMA integrity_check and returns its answer ("ok"
// for a sound database).
func (s *Store) IntegrityCheck(ctx context.Context) (string, error) {
	if s.pg {
		return "ok", nil // PostgreSQL checks its pages itself (data checksums)
	}
	var rows []string
	if err := s.rdb.SelectContext(ctx, &rows, "PRAGMA integrity_check"); err != nil {
		return "", fmt.Errorf("integrity check: %w", err)
	}
	return strings.Join(rows, "\n"), nil
}
