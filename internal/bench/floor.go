package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
)

// floorEpoch is the epoch of the floors' rows: a file identity of the
// length the file feed's has.
const floorEpoch = "raw:00000:0000000000000000"

// floorDB is one connection opened exactly as the store opens its writer
// (outbox.DSN), on a database whose schema the store created, with the
// statements the engine runs prepared on it.
type floorDB struct {
	db      *sql.DB
	inserts map[int]*sql.Stmt // outbox.OutboxInsertSQL by chunk size
	upserts map[int]*sql.Stmt // ledger.UpsertSQL by chunk size
	reads   map[int]*sql.Stmt // ledger.ReadSQL by chunk size
	pos     *sql.Stmt
	stats   *sql.Stmt
	owner   *sql.Stmt
}

// openFloorDB creates the schema through the store (then closes it),
// opens the writer's connection, registers the feed and prepares the
// statements.
func openFloorDB(ctx context.Context, path, synchronous string) (*floorDB, error) {
	cfg := outbox.DefaultConfig(path)
	cfg.Synchronous = synchronous
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Close(); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", outbox.DSN(cfg))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	f := &floorDB{db: db, inserts: map[int]*sql.Stmt{}, upserts: map[int]*sql.Stmt{}, reads: map[int]*sql.Stmt{}}
	if err := f.prepare(ctx); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *floorDB) prepare(ctx context.Context) error {
	if _, err := f.db.ExecContext(ctx, `INSERT INTO feeds (name, kind, processor) VALUES (?, 'file', 'bench')
ON CONFLICT(name) DO NOTHING`, benchFeed); err != nil {
		return fmt.Errorf("insert feed: %w", err)
	}
	if _, err := f.db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('owner', '1') ON CONFLICT(key) DO NOTHING`); err != nil {
		return fmt.Errorf("insert owner: %w", err)
	}
	var err error
	for n := outbox.OutboxInsertChunk; n >= 1; n /= 2 {
		if f.inserts[n], err = f.db.PrepareContext(ctx, outbox.OutboxInsertSQL(n)); err != nil {
			return fmt.Errorf("prepare outbox insert: %w", err)
		}
		if f.upserts[n], err = f.db.PrepareContext(ctx, ledger.UpsertSQL(n)); err != nil {
			return fmt.Errorf("prepare balance upsert: %w", err)
		}
	}
	for n := ledger.ReadChunk; n >= 1; n /= 2 {
		if f.reads[n], err = f.db.PrepareContext(ctx, ledger.ReadSQL(n)); err != nil {
			return fmt.Errorf("prepare balance read: %w", err)
		}
	}
	if f.pos, err = f.db.PrepareContext(ctx, outbox.PositionUpsertSQL); err != nil {
		return fmt.Errorf("prepare position upsert: %w", err)
	}
	if f.stats, err = f.db.PrepareContext(ctx, outbox.StatsUpdateSQL); err != nil {
		return fmt.Errorf("prepare stats update: %w", err)
	}
	// The engine's check, in every commit, that it still owns the database.
	if f.owner, err = f.db.PrepareContext(ctx, `SELECT value FROM meta WHERE key = 'owner'`); err != nil {
		return fmt.Errorf("prepare owner check: %w", err)
	}
	return nil
}

func (f *floorDB) close() error {
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("close floor database: %w", err)
	}
	return nil
}

// sqliteVersion is SQLite's version.
func (f *floorDB) sqliteVersion(ctx context.Context) (string, error) {
	var v string
	if err := f.db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err != nil {
		return "", fmt.Errorf("read sqlite version: %w", err)
	}
	return v, nil
}

// floorBatch is one batch's work, built before the timer: the statement
// arguments of its reads and upserts (in key order) and outbox inserts (in
// line order), and its last position.
type floorBatch struct {
	reads   [][]any
	upserts [][]any
	inserts [][]any
	lines   int64
	last    int64
	// rows are the batch's outbox rows, in line order, when the inputs
	// were asked to keep them (raw_pipeline publishes them).
	rows []floorRow
}

// floorRow is one outbox row of a floor batch: its line's position, and
// the output's key and value.
type floorRow struct {
	pos        int64
	key, value []byte
}

// floorInputs builds the floors' batches from the generated lines, as the
// engine would write them: the ledger's outputs with each account's
// running balance (from start, its balance before the run), forward's the
// lines themselves.
type floorInputs struct {
	g         *lineGen
	processor string
	topic     string
	start     func(account int) int64
	balances  map[int]int64
	keepRows  bool // each batch keeps its rows (floorBatch.rows)
}

func (in *floorInputs) batch(n int64) floorBatch {
	var fb floorBatch
	rows := make([]floorRow, 0, n)
	touched := map[int]int64{}
	var unseen []string
	for range n {
		l, text := in.g.next()
		r := floorRow{pos: l.Position}
		if in.processor == "ledger" {
			b, ok := in.balances[l.Account]
			if !ok {
				b = in.start(l.Account)
				unseen = append(unseen, accountName(l.Account))
			}
			b += l.Amount
			in.balances[l.Account], touched[l.Account] = b, touched[l.Account]+1
			name := accountName(l.Account)
			r.key = []byte(name)
			r.value, _ = json.Marshal(ledger.Output{Account: name, Amount: l.Amount, Balance: b,
				Feed: benchFeed, Epoch: floorEpoch, Position: l.Position}) // plain fields: cannot fail
		} else {
			r.value = append([]byte(nil), text[:len(text)-1]...)
		}
		rows = append(rows, r)
		fb.last = l.Position
	}
	fb.lines = n
	if in.keepRows {
		fb.rows = rows
	}
	fb.reads = readArgs(unseen)
	accounts := make([]string, 0, len(touched))
	for a := range touched {
		accounts = append(accounts, accountName(a))
	}
	slices.Sort(accounts) // bytewise, as ledger_balances' key
	for len(accounts) > 0 {
		k := outbox.ChunkSize(len(accounts), outbox.OutboxInsertChunk)
		args := []any{benchFeed}
		for _, name := range accounts[:k] {
			a := accountNumber(name)
			args = append(args, name, in.balances[a], touched[a])
		}
		fb.upserts = append(fb.upserts, args)
		accounts = accounts[k:]
	}
	for len(rows) > 0 {
		k := outbox.ChunkSize(len(rows), outbox.OutboxInsertChunk)
		args := []any{benchFeed, 0, floorEpoch, in.topic, nil} // created_at is set in the timed part
		for _, r := range rows[:k] {
			args = append(args, r.pos, 0, r.key, r.value, nil)
		}
		fb.inserts = append(fb.inserts, args)
		rows = rows[k:]
	}
	return fb
}

// readArgs are the arguments of the reads of accounts' balances, in key
// order and chunks as the ledger's Prepare reads those it does not hold.
func readArgs(accounts []string) [][]any {
	slices.Sort(accounts)
	var reads [][]any
	for len(accounts) > 0 {
		k := outbox.ChunkSize(len(accounts), ledger.ReadChunk)
		args := []any{benchFeed}
		for _, a := range accounts[:k] {
			args = append(args, a)
		}
		reads = append(reads, args)
		accounts = accounts[k:]
	}
	return reads
}

// accountNumber is the number in an account's name.
func accountNumber(name string) int {
	n := 0
	for _, c := range strings.TrimPrefix(name, "acct-") {
		n = n*10 + int(c-'0')
	}
	return n
}

// write runs one batch in one transaction, as the engine's commit does.
func (f *floorDB) write(ctx context.Context, fb floorBatch, size int64) error {
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	for _, args := range fb.reads {
		if err := f.read(ctx, tx, args); err != nil {
			return err
		}
	}
	for _, args := range fb.upserts {
		if _, err := tx.StmtContext(ctx, f.upserts[(len(args)-1)/3]).ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("upsert balances: %w", err)
		}
	}
	now := time.Now().UnixNano()
	for _, args := range fb.inserts {
		args[4] = now
		if _, err := tx.StmtContext(ctx, f.inserts[(len(args)-5)/5]).ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("insert outbox rows: %w", err)
		}
	}
	if _, err := tx.StmtContext(ctx, f.pos).ExecContext(ctx, benchFeed, 0, floorEpoch, fb.last, size, now); err != nil {
		return fmt.Errorf("store position: %w", err)
	}
	if _, err := tx.StmtContext(ctx, f.stats).ExecContext(ctx, fb.lines, 0, 0, 0, 0, 0, now, benchFeed); err != nil {
		return fmt.Errorf("update stats: %w", err)
	}
	var owner string
	if err := tx.StmtContext(ctx, f.owner).QueryRowContext(ctx).Scan(&owner); err != nil {
		return fmt.Errorf("check owner: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// read runs one read of balances and scans its rows, as the ledger does.
func (f *floorDB) read(ctx context.Context, tx *sql.Tx, args []any) error {
	rows, err := tx.StmtContext(ctx, f.reads[len(args)-1]).QueryContext(ctx, args...)
	if err != nil {
		return fmt.Errorf("read balances: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var account string
		var balance int64
		if err := rows.Scan(&account, &balance); err != nil {
			return fmt.Errorf("read balances: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read balances: %w", err)
	}
	return nil
}

// runRawSQLite measures the ingest ceiling: the tightest plain loop that
// writes what the engine writes for the file, through the store's DSN and
// statements, with every batch's inputs built before its timed part.
func (b *bench) runRawSQLite(ctx context.Context) error {
	res, err := b.rawSQLite(ctx, "raw_sqlite", b.path("raw.db"), b.data, nil)
	if err != nil {
		return err
	}
	b.res.RawSQLite = res
	return nil
}

// rawSQLite runs the raw loop over d into the database at path; start
// gives an account's balance before the run (nil: none has one).
func (b *bench) rawSQLite(ctx context.Context, name, path string, d lineData, start func(int) int64) (*phaseResult, error) {
	f, err := openFloorDB(ctx, path, b.o.Synchronous)
	if err != nil {
		return nil, err
	}
	defer f.close()
	if b.res.Settings.SQLiteVersion == "" {
		if b.res.Settings.SQLiteVersion, err = f.sqliteVersion(ctx); err != nil {
			return nil, err
		}
	}
	if start == nil {
		start = func(int) int64 { return 0 }
	}
	in := &floorInputs{g: d.gen(), processor: b.o.Processor, topic: b.topic("raw"), start: start, balances: map[int]int64{}}
	m := b.startInProcess()
	// Statements get a context that is never done: with one that can be,
	// the driver starts a goroutine per statement to watch it. The run's
	// context is checked between batches instead.
	sctx := context.WithoutCancel(ctx)
	var timed, cpu time.Duration
	for left := d.Lines; left > 0; left -= int64(b.o.BatchMax) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fb := in.batch(min(left, int64(b.o.BatchMax)))
		t0, c0 := time.Now(), selfCPU()
		if err := f.write(sctx, fb, d.Size); err != nil {
			return nil, err
		}
		timed, cpu = timed+time.Since(t0), cpu+selfCPU()-c0
	}
	res := newPhaseResult(d.Lines, timed)
	m.finish(b, name, res)
	res.CPU = newCPUResult(cpu, 0, d.Lines) // the timed parts only
	return res, nil
}

// runCommitFloor measures the least a batch's commit costs: per batch of
// --batch-max lines, the feed's position and COMMIT, nothing else. An
// empty transaction would write nothing to the WAL and sync nothing; one
// row is the smallest commit that reaches the disk.
func (b *bench) runCommitFloor(ctx context.Context) error {
	f, err := openFloorDB(ctx, b.path("commit.db"), b.o.Synchronous)
	if err != nil {
		return err
	}
	defer f.close()
	m := b.startInProcess()
	sctx := context.WithoutCancel(ctx)
	start := time.Now()
	for done := int64(0); done < b.data.Lines; done += int64(b.o.BatchMax) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := f.commitOnly(sctx, done, b.data.Size); err != nil {
			return err
		}
	}
	res := newPhaseResult(b.data.Lines, time.Since(start))
	m.finish(b, "commit_floor", res)
	b.res.CommitFloor = res
	return nil
}

func (f *floorDB) commitOnly(ctx context.Context, pos, size int64) error {
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.StmtContext(ctx, f.pos).ExecContext(ctx, benchFeed, 0, floorEpoch, pos, size, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("store position: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
