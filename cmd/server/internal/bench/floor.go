package bench

import (
	"context"
	"database/sql"
	"encoding/json"
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

// floorDB is the store's ceiling (outbox.Ceiling): one connection
// opened exactly as the store opens its writer, on a database whose schema
// the store created. The raw loop runs the engine's statements there,
// prepared once, with arguments built before the timer: nothing of
// database/sql's conversions is in its timed part, so it is at least as
// tight as the engine (which runs its hot statements the same way).
type floorDB struct {
	c  *outbox.Ceiling
	db *sql.DB // the ceiling's connection through database/sql
}

// openFloorDB opens the ceiling on a new database at path, its feed
// registered.
func openFloorDB(ctx context.Context, path, synchronous string) (*floorDB, error) {
	cfg := outbox.DefaultConfig(path)
	cfg.Synchronous = outbox.SyncMode(synchronous)
	c, err := outbox.OpenCeiling(ctx, cfg, benchFeed)
	if err != nil {
		return nil, err
	}
	return &floorDB{c: c, db: c.DB()}, nil
}

func (f *floorDB) close() error { return f.c.Close() }

// floorBatch is one batch's work, built before the timer: its reads and
// upserts (in key order) and outputs (in line order), as the ceiling runs
// them (outbox.CeilingBatch), and its last position.
type floorBatch struct {
	b     *outbox.CeilingBatch
	lines int64
	last  int64
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
	reads := readStmts(unseen)
	accounts := make([]string, 0, len(touched))
	for a := range touched {
		accounts = append(accounts, accountName(a))
	}
	slices.Sort(accounts) // bytewise, as ledger_balances' key
	var upserts []outbox.CeilingStatement
	for len(accounts) > 0 {
		k := outbox.ChunkSize(len(accounts), ledger.UpsertChunk)
		args := []any{benchFeed}
		for _, name := range accounts[:k] {
			a := accountNumber(name)
			args = append(args, name, in.balances[a], int64(touched[a]))
		}
		upserts = append(upserts, outbox.CeilingStatement{Query: ledger.UpsertSQL(k), Args: args})
		accounts = accounts[k:]
	}
	out := make([]outbox.Row, len(rows))
	for i, r := range rows {
		out[i] = outbox.Row{Feed: benchFeed, Epoch: floorEpoch, Topic: in.topic, Position: r.pos, Key: r.key, Value: r.value}
	}
	fb.b = outbox.NewCeilingBatch(benchFeed, floorEpoch, n, fb.last, reads, upserts, out)
	return fb
}

// readStmts are the reads of accounts' balances, in key order and chunks
// as the ledger's Prepare reads those it does not hold.
func readStmts(accounts []string) []outbox.CeilingStatement {
	slices.Sort(accounts)
	var reads []outbox.CeilingStatement
	for len(accounts) > 0 {
		k := outbox.ChunkSize(len(accounts), ledger.ReadChunk)
		args := []any{benchFeed}
		for _, a := range accounts[:k] {
			args = append(args, a)
		}
		reads = append(reads, outbox.CeilingStatement{Query: ledger.ReadSQL(k), Args: args})
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
	return f.c.Write(ctx, fb.b, size)
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
	return f.c.CommitOnly(ctx, benchFeed, floorEpoch, pos, size)
}
