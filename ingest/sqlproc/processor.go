package sqlproc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Processor runs a Config's statements for each item. It is safe for use
// by several feeds at once.
type Processor struct {
	plan   *plan
	reject *runStmt
	apply  []runStmt
	emit   *runStmt
	wtime  *runStmt  // a window's event time
	used   []bool    // per parameter slot: some statement uses it
	states sync.Pool // *itemState

	guarded sync.Map // *outbox.Store -> struct{}: stores seen to have the guard
	pg      bool     // made by NewPostgres: its SQL is PostgreSQL's
}

var (
	_ ingest.Processor = (*Processor)(nil)
	_ ingest.Setupper  = (*Processor)(nil)
)

// runStmt is a statement ready to run: its text and, per parameter, the
// slot of the bound item that holds its value.
type runStmt struct {
	name  string            // "apply statement 2", for errors
	stmt  *outbox.Statement // with ?N for the parameters, see statement.positional
	slots []int
}

// New checks cfg (Validate, then Check against a scratch database) and
// returns its processor. The error is one line naming the processor and,
// for a statement, which one.
func New(cfg Config) (*Processor, error) {
	p, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	if err := p.check(context.Background()); err != nil {
		return nil, err
	}
	return newProcessor(p), nil
}

// NewPostgres checks cfg (Validate) and returns its processor for a
// PostgreSQL store: its SQL is PostgreSQL's, which the SQLite scratch
// database of New cannot judge, so every statement is PREPAREd on the
// real database by Setup instead, where a syntax error or a missing table
// fails the start with one line naming the processor, the statement and
// PostgreSQL's message. Its Setup and Apply refuse a SQLite store.
func NewPostgres(cfg Config) (*Processor, error) {
	p, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	if p.window != nil || len(p.reads) > 0 {
		return nil, fmt.Errorf("sqlproc %s: %w", cfg.Name, errPGUnsupported)
	}
	proc := newProcessor(p)
	proc.pg = true
	return proc, nil
}

// errPGUnsupported says what of a SQL processor does not run on
// PostgreSQL in this version.
var errPGUnsupported = errors.New("window and reads run on a SQLite --db only in this version")

func newProcessor(p *plan) *Processor {
	proc := &Processor{plan: p, used: make([]bool, len(p.params))}
	prep := func(field string, i, n int, s statement) runStmt {
		r := runStmt{name: stmtName(field, i, n, s.text), stmt: outbox.NewStatement(s.positional())}
		for _, name := range s.params {
			slot := slices.Index(p.params, name)
			r.slots = append(r.slots, slot)
			proc.used[slot] = true
		}
		return r
	}
	if p.reject != nil {
		r := prep("reject", 0, 1, *p.reject)
		proc.reject = &r
	}
	for i, s := range p.apply {
		proc.apply = append(proc.apply, prep("apply", i, len(p.apply), s))
	}
	if p.emit != nil {
		r := prep("emit", 0, 1, *p.emit)
		proc.emit = &r
	}
	if p.window != nil {
		r := prep("window.time", 0, 1, *p.window.time)
		proc.wtime = &r
	}
	proc.states.New = func() any { return proc.newState() }
	return proc
}

// Name is the processor's name.
func (p *Processor) Name() string { return p.plan.cfg.Name }

// Setup runs in tx what the processors it reads need (see ReadSource),
// then its setup statements, then its migrations that have not run (see
// Migration), then compiles every other
// statement against the database as it now is, so a schema that differs
// from the one Check saw (tables an earlier setup left) fails the start,
// not each item. It fails on a store without the guard (see Guard).
func (p *Processor) Setup(ctx context.Context, tx *outbox.Tx) error {
	if err := p.checkGuard(ctx, tx); err != nil {
		return err
	}
	var own []string
	if p.pg {
		var err error
		if own, err = p.plan.pgOwnTables(); err != nil {
			return err
		}
		if err := p.pgClaimCheck(ctx, tx, own); err != nil {
			return err
		}
	}
	if err := p.plan.prepare(ctx, tx); err != nil {
		return err
	}
	if p.pg {
		if err := p.pgClaim(ctx, tx, own); err != nil {
			return err
		}
		if err := p.pgCheck(ctx, tx, own); err != nil {
			return err
		}
	}
	for _, r := range p.statements() {
		if _, err := tx.Stmt(ctx, r.stmt.String()); err != nil {
			if p.pg {
				return fmt.Errorf("sqlproc %s: %s: %s", p.Name(), r.name, pgMessage(err))
			}
			return fmt.Errorf("sqlproc %s: %s: %s", p.Name(), r.name, sqliteMessage(err))
		}
	}
	if w := p.plan.window; w != nil {
		return w.checkTable(ctx, tx, p.Name())
	}
	return nil
}

func (p *Processor) statements() []*runStmt {
	var all []*runStmt
	if p.wtime != nil {
		all = append(all, p.wtime)
	}
	if p.reject != nil {
		all = append(all, p.reject)
	}
	for i := range p.apply {
		all = append(all, &p.apply[i])
	}
	if p.emit != nil {
		all = append(all, p.emit)
	}
	return all
}

// checkGuard makes sure the store's writer connection has the guard, once
// per store.
func (p *Processor) checkGuard(ctx context.Context, tx *outbox.Tx) error {
	if _, ok := p.guarded.Load(tx.Store()); ok {
		return nil
	}
	if pg := tx.Store().Postgres(); pg || p.pg {
		if pg != p.pg {
			return fmt.Errorf("sqlproc %s: %w", p.Name(), errWrongStore)
		}
		p.guarded.Store(tx.Store(), struct{}{})
		return nil
	}
	_, err := tx.Exec(ctx, probeGuard)
	if err == nil {
		return fmt.Errorf("sqlproc %s: %w", p.Name(), errNoGuard)
	}
	if perm, ok := ingest.IsPermanent(classify(err)); !ok || perm.Reason != ReasonForbidden {
		return fmt.Errorf("sqlproc %s: look for the SQL guard: %w", p.Name(), err)
	}
	p.guarded.Store(tx.Store(), struct{}{})
	return nil
}

// Apply decodes the item, runs reject, then apply's statements, then emit,
// whose rows it emits. Its error is permanent (a dead letter) for input
// that does not decode, a reject row, a broken constraint, a statement that
// cannot run on the item's values and an emit row that is not an output;
// any other is transient (see classify).
//
// The statements are declared to the store, which runs them on its
// fastest path (outbox.Tx.Batch), prepared once per store: database/sql's own work per statement (its argument
// conversion, its locks, a goroutine per result set watching the context)
// costs as much as a small statement's execution.
func (p *Processor) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if err := p.checkGuard(ctx, tx); err != nil {
		return err
	}
	s := p.states.Get().(*itemState)
	defer p.states.Put(s)
	if err := s.bind(d, item); err != nil {
		return ingest.Permanent(ingest.ReasonMalformed, err)
	}
	if p.pg {
		if err := s.pgText(); err != nil {
			return ingest.Permanent(ingest.ReasonMalformed, err)
		}
	}
	s.failed, s.verdict, s.bad = nil, nil, s.bad[:0]
	err := tx.Batch(func(b *outbox.Batch) error { return p.run(ctx, tx, b, s) })
	switch {
	case err != nil && s.failed != nil:
		return p.stmtError(s.failed, err)
	case err != nil:
		return fmt.Errorf("sqlproc %s: %w", p.Name(), err)
	case s.verdict == nil && len(s.bad) > 0:
		return p.deadWindows(ctx, tx, d, s)
	}
	return s.verdict
}

// run runs the item's statements in the store's batch b. A statement's
// error is returned, s.failed naming the statement; the item's own verdict
// (a reject row, an emit row that is not an output) is left in s.verdict,
// so that only SQLite's errors are taken for the connection's.
func (p *Processor) run(ctx context.Context, tx *outbox.Tx, b *outbox.Batch, s *itemState) error {
	if p.reject != nil {
		if err := p.runReject(ctx, b, s); err != nil || s.verdict != nil {
			return err
		}
	}
	if p.wtime != nil {
		return p.runWindowed(ctx, tx, b, s)
	}
	for i := range p.apply {
		r := &p.apply[i]
		s.failed = r
		if err := b.Exec(ctx, r.stmt, s.args(r)...); err != nil {
			return err
		}
	}
	if p.emit != nil {
		return p.runEmit(ctx, tx, b, s)
	}
	s.failed = nil
	return nil
}

// stmtError is a statement's error, classified, naming the statement.
func (p *Processor) stmtError(r *runStmt, err error) error {
	err = classify(err)
	if perm, ok := ingest.IsPermanent(err); ok {
		return ingest.Permanent(perm.Reason, fmt.Errorf("%s: %w", r.name, perm.Err))
	}
	return fmt.Errorf("sqlproc %s: %s: %w", p.Name(), r.name, err)
}

// query runs statement r, whose rows the caller closes.
func (p *Processor) query(ctx context.Context, b *outbox.Batch, s *itemState, r *runStmt) (*outbox.Rows, error) {
	s.failed = r
	return b.Query(ctx, r.stmt, s.args(r)...)
}

// next reads rows' next row into s.row: false at the end (err nil) or on
// an error.
func (s *itemState) next(rows *outbox.Rows) (bool, error) {
	ok, err := rows.Next()
	if ok {
		s.row = rows.Values()
	}
	return ok, err
}

// runReject makes the item's verdict a dead letter when the reject query
// returns a row.
func (p *Processor) runReject(ctx context.Context, b *outbox.Batch, s *itemState) error {
	rows, err := p.query(ctx, b, s, p.reject)
	if err != nil {
		return err
	}
	defer rows.Close()
	ok, err := s.next(rows)
	if !ok {
		return err
	}
	s.cells[0].v, s.cells[1].v = s.row[0], nil
	if len(s.row) > 1 {
		s.cells[1].v = s.row[1]
	}
	reason := clip(s.cells[0].text(), maxReason)
	if reason == "" {
		reason = ReasonRejected
	}
	msg := clip(s.cells[1].text(), maxRejectError)
	if msg == "" {
		msg = "rejected by the reject statement"
	}
	s.verdict = ingest.Permanent(reason, rejection(msg))
	return nil
}

// Bounds of what a reject row gives a dead letter: a reason is a short
// machine-readable word, the error one line of text.
const (
	maxReason      = 64
	maxRejectError = 1024
)

// clip cuts s to at most max bytes, at a character's start, on one line.
func clip(s string, max int) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	if len(s) <= max {
		return s
	}
	for max > 0 && !utf8.RuneStart(s[max]) {
		max--
	}
	return s[:max]
}

// rejection is the error of an item a reject row refused.
type rejection string

func (r rejection) Error() string { return string(r) }

// runEmit emits each row of the emit statement; a row that is not an
// output makes the item's verdict a dead letter.
func (p *Processor) runEmit(ctx context.Context, tx *outbox.Tx, b *outbox.Batch, s *itemState) error {
	rows, err := p.query(ctx, b, s, p.emit)
	if err != nil {
		return err
	}
	defer rows.Close()
	if err := s.emitDest(rows.Columns()); err != nil {
		s.verdict = ingest.Permanent(ReasonBadOutput, fmt.Errorf("%s: %w", p.emit.name, err))
		return nil
	}
	for n := 0; ; n++ {
		ok, err := s.next(rows)
		if !ok {
			if err == nil {
				s.failed = nil
			}
			return err
		}
		s.fill()
		o, err := s.output(p.plan.cfg.Topic)
		if err != nil {
			s.verdict = ingest.Permanent(ReasonBadOutput, fmt.Errorf("%s: row %d: %w", p.emit.name, n+1, err))
			return nil
		}
		if err := tx.Emit(ctx, o); err != nil {
			s.verdict = err
			return nil
		}
	}
}

// cell holds one column's value as the driver gave it: int64, float64,
// string, []byte or nil.
type cell struct{ v any }

// text is the cell as text ("" for NULL).
func (c *cell) text() string {
	switch v := c.v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return ""
}
