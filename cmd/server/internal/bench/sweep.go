package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
)

// sweepResult is a sweep over the state's size: at each point, the state
// is written first (untimed), then the floor and the server each apply
// the same file to a copy of it.
type sweepResult struct {
	Of     string       `json:"of"` // what varies: "accounts"
	Lines  int64        `json:"lines"`
	Points []sweepPoint `json:"points"`
}

// sweepPoint is one size of the sweep.
type sweepPoint struct {
	Accounts       int          `json:"accounts"`
	PrefillSeconds float64      `json:"prefill_seconds"`
	DBMiB          float64      `json:"db_mib"` // the prefilled database (orders: the database after the run)
	RawSQLite      *phaseResult `json:"raw_sqlite"`
	Ingest         *phaseResult `json:"ingest"`
	// IngestRawSQLite is ingest / raw_sqlite at this size; IngestOfFirst
	// is ingest / ingest at the sweep's first size.
	IngestRawSQLite float64 `json:"ingest_raw_sqlite"`
	IngestOfFirst   float64 `json:"ingest_of_first"`
}

// prefillBalance is account i's balance before a sweep's run: not zero,
// so an engine that failed to read it would store a wrong one.
func prefillBalance(i int) int64 { return int64(mix64(uint64(i)^0x5bd1e995)%1000) + 1 }

// runSweep measures raw_sqlite and ingest at each size.
func (b *bench) runSweep(ctx context.Context) error {
	b.res.Sweep = &sweepResult{Of: b.o.Sweep, Lines: b.o.Lines}
	for _, n := range b.o.SweepSizes {
		p, err := b.sweepPoint(ctx, n)
		if err != nil {
			return fmt.Errorf("sweep at %d accounts: %w", n, err)
		}
		if first := b.res.Sweep.Points; len(first) > 0 {
			p.IngestOfFirst = ratio(p.Ingest, first[0].Ingest)
		} else {
			p.IngestOfFirst = 1
		}
		b.res.Sweep.Points = append(b.res.Sweep.Points, p)
		b.say("sweep: %d: ingest %.0f items/s (%.2f of raw_sqlite, %.2f of the first size), peak RSS %.1f MiB",
			n, p.Ingest.PerSecond, p.IngestRawSQLite, p.IngestOfFirst, p.Ingest.PeakRSSMiB)
	}
	if b.o.Chart != "" {
		if err := writeSweepChart(b.res.Sweep, b.o.Chart); err != nil {
			return err
		}
		b.say("chart written to %s", b.o.Chart)
	}
	return nil
}

// sweepPoint prefills a state of n accounts, then runs the floor and the
// server over the same file on copies of it.
func (b *bench) sweepPoint(ctx context.Context, n int) (sweepPoint, error) {
	p := sweepPoint{Accounts: n}
	if b.o.Processor == "orders" {
		// The state is the open orders, built by the events themselves.
		var err error
		p.Ingest, p.DBMiB, err = b.ordersAt(ctx, "ingest@"+strconv.Itoa(n), n)
		return p, err
	}
	tmpl, floor, engine := b.path("sweep-state.db"), b.path("sweep-raw.db"), b.path("sweep-ingest.db")
	defer removeDB(tmpl, floor, engine)
	start := time.Now()
	if err := b.prefill(ctx, tmpl, n); err != nil {
		return p, err
	}
	p.PrefillSeconds = round3(time.Since(start).Seconds())
	if fi, err := os.Stat(tmpl); err == nil {
		p.DBMiB = round1(float64(fi.Size()) / (1 << 20))
	}
	lines, err := b.inputPath("sweep-lines.txt")
	if err != nil {
		return p, err
	}
	d, err := writeLines(ctx, lines, b.o.Lines, n, b.o.LineBytes, b.o.LineFill)
	if err != nil {
		return p, err
	}
	d.Sums, d.Counts = nil, nil
	for _, c := range []string{floor, engine} {
		if err := copyFile(tmpl, c); err != nil {
			return p, err
		}
	}
	name := "@" + strconv.Itoa(n)
	if p.RawSQLite, err = b.rawSQLite(ctx, "raw_sqlite"+name, floor, d, prefillBalance); err != nil {
		return p, err
	}
	// The phase names the server child's profile (--cpuprofile).
	b.phase = "ingest" + name
	p.Ingest, err = b.ingestFile(ctx, b.phase, b.ingestSpec(engine, d), d)
	b.phase = ""
	if err != nil {
		return p, err
	}
	p.IngestRawSQLite = ratio(p.Ingest, p.RawSQLite)
	return p, nil
}

// prefill writes n accounts' balances (prefillBalance) to a new database
// at path, in key order, through the ledger's own upsert, and checkpoints
// it so the copies start with an empty WAL.
func (b *bench) prefill(ctx context.Context, path string, n int) error {
	f, err := openFloorDB(ctx, path, string(outbox.SyncNormal)) // the state is written before the timer
	if err != nil {
		return err
	}
	defer f.close()
	const perTx = 1 << 20 // rows per transaction, to bound the WAL
	names := make([]int, 0, perTx)
	err = lexOrder(n, func(i int) error {
		if names = append(names, i); len(names) < perTx {
			return nil
		}
		err := f.prefillTx(ctx, names)
		names = names[:0]
		return err
	})
	if err == nil {
		err = f.prefillTx(ctx, names)
	}
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	if _, err := f.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return fmt.Errorf("prefill: checkpoint: %w", err)
	}
	return nil
}

// prefillTx writes the accounts in one transaction, in statements of
// outbox.ChunkSize rows.
func (f *floorDB) prefillTx(ctx context.Context, accounts []int) error {
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	args := make([]any, 0, 1+3*ledger.UpsertChunk)
	for len(accounts) > 0 {
		k := outbox.ChunkSize(len(accounts), ledger.UpsertChunk)
		args = append(args[:0], benchFeed)
		for _, a := range accounts[:k] {
			args = append(args, accountName(a), prefillBalance(a), 1)
		}
		if _, err := tx.ExecContext(ctx, ledger.UpsertSQL(k), args...); err != nil {
			return err
		}
		accounts = accounts[k:]
	}
	return tx.Commit()
}

// copyFile copies a database file (its WAL is empty).
func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("copy %s: %w", from, err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		return fmt.Errorf("copy to %s: %w", to, err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return fmt.Errorf("copy to %s: %w", to, err)
	}
	if err := dst.Close(); err != nil {
		return fmt.Errorf("copy to %s: %w", to, err)
	}
	return nil
}

// removeDB removes databases with their WAL and shared memory files.
func removeDB(paths ...string) {
	for _, p := range paths {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			os.Remove(p + suffix)
		}
	}
}

// table writes the sweep for people.
func (s *sweepResult) table(w io.Writer) error {
	fmt.Fprintf(w, "sweep of the state: %d items applied at each size (accounts written before, untimed; or open orders)\n\n", s.Lines)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tdb MiB\traw_sqlite items/s\tCPU/item\tingest items/s\tCPU/item\tpeak RSS\tof raw_sqlite\tof the first\t")
	for _, p := range s.Points {
		raw, rawCPU, ofRaw := "-", "-", "-" // orders have no raw_sqlite
		if p.RawSQLite != nil {
			raw, rawCPU = fmt.Sprintf("%.0f", p.RawSQLite.PerSecond), p.RawSQLite.CPU.String()
			ofRaw = fmt.Sprintf("%.2f", p.IngestRawSQLite)
		}
		fmt.Fprintf(tw, "%d\t%.1f\t%s\t%s\t%.0f\t%s\t%.1f MiB\t%s\t%.2f\t\n", p.Accounts, p.DBMiB,
			raw, rawCPU, p.Ingest.PerSecond, p.Ingest.CPU.String(), p.Ingest.PeakRSSMiB, ofRaw, p.IngestOfFirst)
	}
	return tw.Flush()
}
