package bench

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
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
// (outbox.DSN), on a database whose schema the store created. The raw
// loop runs the engine's statements on the driver's connection, prepared
// once, with driver arguments built before the timer: nothing of
// database/sql's conversions is in its timed part, so it is at least as
// tight as the engine (which runs its hot statements the same way).
type floorDB struct {
	db  *sql.DB
	raw *floorStmts // prepared on the connection raw.dc, at the first write
}

// floorStmts are the driver statements of the raw loop, on one driver
// connection.
type floorStmts struct {
	dc      any
	inserts map[int]driver.Stmt // outbox.OutboxChunkInsertSQL by chunk count
	upserts map[int]driver.Stmt // ledger.UpsertSQL by chunk size
	reads   map[int]driver.Stmt // ledger.ReadSQL by chunk size
	lastID  driver.Stmt
	setLast driver.Stmt
	pos     driver.Stmt
	stats   driver.Stmt
	owner   driver.Stmt
	all     []driver.Stmt
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
	f := &floorDB{db: db}
	if err := f.register(ctx); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// register writes the feed and the owner the engine's statements expect.
func (f *floorDB) register(ctx context.Context) error {
	if _, err := f.db.ExecContext(ctx, `INSERT INTO feeds (name, kind, processor) VALUES (?, 'file', 'bench')
ON CONFLICT(name) DO NOTHING`, benchFeed); err != nil {
		return fmt.Errorf("insert feed: %w", err)
	}
	if _, err := f.db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('owner', '1') ON CONFLICT(key) DO NOTHING`); err != nil {
		return fmt.Errorf("insert owner: %w", err)
	}
	return nil
}

// stmtsOn is the raw loop's statements on the driver connection dc,
// prepared there the first time (the pool of one connection gives the
// same one back each time; another one gets its own).
func (f *floorDB) stmtsOn(dc any) (*floorStmts, error) {
	if f.raw != nil && f.raw.dc == dc {
		return f.raw, nil
	}
	c, ok := dc.(driver.Conn)
	if !ok {
		return nil, fmt.Errorf("prepare: the SQLite driver's connection is a %T", dc)
	}
	st := &floorStmts{dc: dc, inserts: map[int]driver.Stmt{}, upserts: map[int]driver.Stmt{}, reads: map[int]driver.Stmt{}}
	prep := func(what, query string) (driver.Stmt, error) {
		ds, err := c.Prepare(query)
		if err != nil {
			return nil, fmt.Errorf("prepare %s: %w", what, err)
		}
		st.all = append(st.all, ds)
		return ds, nil
	}
	err := func() (err error) {
		for n := outbox.OutboxChunkInsertMax; n >= 1; n /= 2 {
			if st.inserts[n], err = prep("outbox insert", outbox.OutboxChunkInsertSQL(n)); err != nil {
				return err
			}
		}
		for n := ledger.UpsertChunk; n >= 1; n /= 2 {
			if st.upserts[n], err = prep("balance upsert", ledger.UpsertSQL(n)); err != nil {
				return err
			}
		}
		if st.lastID, err = prep("last outbox id", outbox.OutboxLastIDSQL); err != nil {
			return err
		}
		if st.setLast, err = prep("last outbox id update", outbox.OutboxSetLastIDSQL); err != nil {
			return err
		}
		for n := ledger.ReadChunk; n >= 1; n /= 2 {
			if st.reads[n], err = prep("balance read", ledger.ReadSQL(n)); err != nil {
				return err
			}
		}
		if st.pos, err = prep("position upsert", outbox.PositionUpsertSQL); err != nil {
			return err
		}
		if st.stats, err = prep("stats update", outbox.StatsUpdateSQL); err != nil {
			return err
		}
		// The engine's check, in every commit, that it still owns the database.
		st.owner, err = prep("owner check", `SELECT value FROM meta WHERE key = 'owner'`)
		return err
	}()
	if err != nil {
		st.close()
		return nil, err
	}
	// A former connection's statements went with it: database/sql opens
	// another only once that one is closed.
	f.raw = st
	return st, nil
}

// close closes the statements.
func (st *floorStmts) close() {
	for _, ds := range st.all {
		ds.Close()
	}
	st.all = nil
}

// closeOn closes the statements if they were prepared on dc (a nil
// floorStmts has none).
func (st *floorStmts) closeOn(dc any) {
	if st != nil && st.dc == dc {
		st.close()
	}
}

func (f *floorDB) close() error {
	if f.raw != nil {
		// Statements left open keep SQLite's files open past Close.
		err := f.onConn(context.Background(), func(dc any) error { f.raw.closeOn(dc); return nil })
		f.raw = nil
		if err != nil {
			f.db.Close()
			return fmt.Errorf("close floor statements: %w", err)
		}
	}
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("close floor database: %w", err)
	}
	return nil
}

// onConn runs fn on the driver connection of the pool's one connection.
func (f *floorDB) onConn(ctx context.Context, fn func(dc any) error) error {
	c, err := f.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connection: %w", err)
	}
	defer c.Close()
	return c.Raw(fn)
}

// floorBatch is one batch's work, built before the timer: the statement
// arguments of its reads and upserts (in key order) and outbox inserts (in
// line order: its outputs packed in chunks as the engine packs them, each
// chunk's last id an offset from the id before the batch, set in the
// timed part), and its last position.
type floorBatch struct {
	reads   [][]driver.NamedValue
	upserts [][]driver.NamedValue
	inserts [][]driver.NamedValue
	offsets [][]int64 // per insert, each chunk's last id less the id before the batch
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
		k := outbox.ChunkSize(len(accounts), ledger.UpsertChunk)
		args := outbox.DriverArgs(nil, benchFeed)
		for _, name := range accounts[:k] {
			a := accountNumber(name)
			args = outbox.DriverArgs(args, name, in.balances[a], int64(touched[a]))
		}
		fb.upserts = append(fb.upserts, args)
		accounts = accounts[k:]
	}
	out := make([]outbox.Row, len(rows))
	for i, r := range rows {
		out[i] = outbox.Row{Feed: benchFeed, Epoch: floorEpoch, Topic: in.topic, Position: r.pos, Key: r.key, Value: r.value}
	}
	chunks := outbox.PackOutputs(out)
	for len(chunks) > 0 {
		k := outbox.ChunkSize(len(chunks), outbox.OutboxChunkInsertMax)
		var args []driver.NamedValue
		var offs []int64
		for _, c := range chunks[:k] {
			offs = append(offs, int64(c.Start+c.N))
			// The last id and the creation time are set in the timed part.
			args = outbox.DriverArgs(args, nil, int64(c.N), c.Position, benchFeed, int64(0), floorEpoch, in.topic, nil, c.Bytes, c.Body)
		}
		fb.inserts = append(fb.inserts, args)
		fb.offsets = append(fb.offsets, offs)
		chunks = chunks[k:]
	}
	return fb
}

// readArgs are the arguments of the reads of accounts' balances, in key
// order and chunks as the ledger's Prepare reads those it does not hold.
func readArgs(accounts []string) [][]driver.NamedValue {
	slices.Sort(accounts)
	var reads [][]driver.NamedValue
	for len(accounts) > 0 {
		k := outbox.ChunkSize(len(accounts), ledger.ReadChunk)
		args := outbox.DriverArgs(nil, benchFeed)
		for _, a := range accounts[:k] {
			args = outbox.DriverArgs(args, a)
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

// write runs one batch in one transaction, as the engine's commit does,
// on the driver's connection.
func (f *floorDB) write(ctx context.Context, fb floorBatch, size int64) error {
	return f.txn(ctx, func(st *floorStmts) error { return st.batch(ctx, fb, size) })
}

// txn runs fn in one transaction on the driver's connection.
func (f *floorDB) txn(ctx context.Context, fn func(*floorStmts) error) error {
	return f.onConn(ctx, func(dc any) error {
		st, err := f.stmtsOn(dc)
		if err != nil {
			return err
		}
		b, ok := dc.(driver.ConnBeginTx)
		if !ok {
			return fmt.Errorf("begin: the SQLite driver's connection is a %T", dc)
		}
		tx, err := b.BeginTx(ctx, driver.TxOptions{}) // IMMEDIATE, from the DSN
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		if err := fn(st); err != nil {
			if rerr := tx.Rollback(); rerr != nil {
				err = fmt.Errorf("%w (and roll back: %v)", err, rerr)
			}
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		return nil
	})
}

// batch runs a batch's statements in the open transaction.
func (st *floorStmts) batch(ctx context.Context, fb floorBatch, size int64) error {
	row := make([]driver.Value, 2)
	for _, args := range fb.reads {
		if err := queryStmt(ctx, st.reads[len(args)-1], args, row, "read balances"); err != nil {
			return err
		}
	}
	for _, args := range fb.upserts {
		if err := execStmt(ctx, st.upserts[(len(args)-1)/3], args, "upsert balances"); err != nil {
			return err
		}
	}
	now := time.Now().UnixNano()
	if len(fb.inserts) > 0 {
		if err := queryStmt(ctx, st.lastID, nil, row[:1], "read the last outbox id"); err != nil {
			return err
		}
		last, _ := row[0].(int64)
		for i, args := range fb.inserts {
			for j, off := range fb.offsets[i] {
				args[j*10].Value, args[j*10+7].Value = last+off, now
			}
			if err := execStmt(ctx, st.inserts[len(fb.offsets[i])], args, "insert outbox rows"); err != nil {
				return err
			}
		}
		offs := fb.offsets[len(fb.offsets)-1]
		if err := execStmt(ctx, st.setLast, outbox.DriverArgs(nil, last+offs[len(offs)-1]), "store the last outbox id"); err != nil {
			return err
		}
	}
	if err := execStmt(ctx, st.pos, outbox.DriverArgs(nil, benchFeed, int64(0), floorEpoch, fb.last, size, now), "store position"); err != nil {
		return err
	}
	if err := execStmt(ctx, st.stats, outbox.DriverArgs(nil, fb.lines, int64(0), int64(0), int64(0), int64(0), int64(0), now, benchFeed), "update stats"); err != nil {
		return err
	}
	return queryStmt(ctx, st.owner, nil, row[:1], "check owner")
}

// execStmt runs a driver statement.
func execStmt(ctx context.Context, ds driver.Stmt, args []driver.NamedValue, what string) error {
	ex, ok := ds.(driver.StmtExecContext)
	if !ok {
		return fmt.Errorf("%s: the SQLite driver's statement is a %T", what, ds)
	}
	if _, err := ex.ExecContext(ctx, args); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// queryStmt runs a driver statement and reads its rows into dest, as the
// engine reads them.
func queryStmt(ctx context.Context, ds driver.Stmt, args []driver.NamedValue, dest []driver.Value, what string) error {
	q, ok := ds.(driver.StmtQueryContext)
	if !ok {
		return fmt.Errorf("%s: the SQLite driver's statement is a %T", what, ds)
	}
	rows, err := q.QueryContext(ctx, args)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for {
		if err := rows.Next(dest); err == io.EOF {
			break
		} else if err != nil {
			rows.Close()
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
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
		collected := withoutGC()
		t0, c0 := time.Now(), selfCPU()
		err := f.write(sctx, fb, d.Size)
		timed, cpu = timed+time.Since(t0), cpu+selfCPU()-c0
		collected()
		if err != nil {
			return nil, err
		}
	}
	res := newPhaseResult(d.Lines, timed)
	m.finish(b, name, res)
	res.CPU = newCPUResult(cpu, 0, d.Lines) // the timed parts only
	releaseMemory()
	return res, nil
}

// withoutGC quiets Go's collector for a ceiling's timed part, after a
// collection of what building its inputs left: a ceiling is the least work
// its phase could do, and collecting (the prebuilt inputs are scanned at
// every cycle) is no part of that work. The collector runs again only
// once the memory in use has grown by gcHeadroom, so a phase that makes
// much garbage (the producer's encoded and compressed batches) reuses
// memory still in the CPU's caches instead of touching fresh pages. The
// function it returns restores the collector's settings.
func withoutGC() (collect func()) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	oldPercent := debug.SetGCPercent(-1)
	oldLimit := debug.SetMemoryLimit(int64(ms.Sys-ms.HeapReleased) + gcHeadroom)
	return func() {
		debug.SetMemoryLimit(oldLimit)
		debug.SetGCPercent(oldPercent)
	}
}

// gcHeadroom is the garbage a ceiling's timed part may make before Go's
// collector runs (withoutGC): 32 MiB made raw_pipeline fastest with 1 KiB
// lines, and turning the collector off altogether was slower than Go's
// defaults (figures: docs/performance.md).
const gcHeadroom = 32 << 20

// releaseMemory gives the memory a phase's inputs took back to the system
// once the phase is done: a child process started later (the replay
// command) inherits the bench's peak as its own in the kernel's count of
// its peak RSS.
func releaseMemory() { debug.FreeOSMemory() }

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
	return f.txn(ctx, func(st *floorStmts) error {
		args := outbox.DriverArgs(nil, benchFeed, int64(0), floorEpoch, pos, size, time.Now().UnixNano())
		return execStmt(ctx, st.pos, args, "store position")
	})
}
