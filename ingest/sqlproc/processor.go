package sqlproc

import (
	"context"
	"database/sql"
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
	used   []bool    // per parameter slot: some statement uses it
	states sync.Pool // *itemState

	guarded sync.Map // *outbox.Store -> struct{}: stores seen to have the guard
}

var (
	_ ingest.Processor = (*Processor)(nil)
	_ ingest.Setupper  = (*Processor)(nil)
)

// runStmt is a statement ready to run: its text and, per parameter, the
// slot of the bound item that holds its value.
type runStmt struct {
	name  string // "apply statement 2", for errors
	text  string // with ?N for the parameters, see statement.positional
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

func newProcessor(p *plan) *Processor {
	proc := &Processor{plan: p, used: make([]bool, len(p.params))}
	prep := func(field string, i, n int, s statement) runStmt {
		r := runStmt{name: stmtName(field, i, n, s.text), text: s.positional()}
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
	proc.states.New = func() any { return proc.newState() }
	return proc
}

// Name is the processor's name.
func (p *Processor) Name() string { return p.plan.cfg.Name }

// Setup runs the setup statements in tx, then compiles every other
// statement against the database as it now is, so a schema that differs
// from the one Check saw (tables an earlier setup left) fails the start,
// not each item. It fails on a store without the guard (see Guard).
func (p *Processor) Setup(ctx context.Context, tx *outbox.Tx) error {
	if err := p.checkGuard(ctx, tx); err != nil {
		return err
	}
	for i, s := range p.plan.setup {
		if _, err := tx.Exec(ctx, s.text); err != nil {
			return fmt.Errorf("sqlproc %s: %s: %s", p.Name(), stmtName("setup", i, len(p.plan.setup), s.text), sqliteMessage(err))
		}
	}
	for _, r := range p.statements() {
		if _, err := tx.Stmt(ctx, r.text); err != nil {
			return fmt.Errorf("sqlproc %s: %s: %s", p.Name(), r.name, sqliteMessage(err))
		}
	}
	return nil
}

func (p *Processor) statements() []*runStmt {
	var all []*runStmt
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
func (p *Processor) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if err := p.checkGuard(ctx, tx); err != nil {
		return err
	}
	s := p.states.Get().(*itemState)
	defer p.states.Put(s)
	if err := s.bind(d, item); err != nil {
		return ingest.Permanent(ingest.ReasonMalformed, err)
	}
	if p.reject != nil {
		if err := p.runReject(ctx, tx, s); err != nil {
			return err
		}
	}
	for i := range p.apply {
		r := &p.apply[i]
		st, err := tx.Stmt(ctx, r.text)
		if err == nil {
			_, err = st.ExecContext(ctx, s.args(r)...)
		}
		if err != nil {
			return p.stmtError(r, err)
		}
	}
	if p.emit != nil {
		return p.runEmit(ctx, tx, s)
	}
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

func (p *Processor) query(ctx context.Context, tx *outbox.Tx, s *itemState, r *runStmt) (*sql.Rows, error) {
	st, err := tx.Stmt(ctx, r.text)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, s.args(r)...)
}

// runReject dead-letters the item when the reject query returns a row.
func (p *Processor) runReject(ctx context.Context, tx *outbox.Tx, s *itemState) error {
	rows, err := p.query(ctx, tx, s, p.reject)
	if err != nil {
		return p.stmtError(p.reject, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return p.stmtError(p.reject, err)
		}
		return nil
	}
	cols, err := rows.Columns()
	if err != nil {
		return p.stmtError(p.reject, err)
	}
	s.cells[1].v = nil
	if err := rows.Scan(s.rejectScan[:min(len(cols), 2)]...); err != nil {
		return p.stmtError(p.reject, err)
	}
	reason := clip(s.cells[0].text(), maxReason)
	if reason == "" {
		reason = ReasonRejected
	}
	msg := clip(s.cells[1].text(), maxRejectError)
	if msg == "" {
		msg = "rejected by the reject statement"
	}
	return ingest.Permanent(reason, rejection(msg))
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

// runEmit emits each row of the emit statement.
func (p *Processor) runEmit(ctx context.Context, tx *outbox.Tx, s *itemState) error {
	rows, err := p.query(ctx, tx, s, p.emit)
	if err != nil {
		return p.stmtError(p.emit, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return p.stmtError(p.emit, err)
	}
	dest, err := s.emitDest(cols)
	if err != nil {
		return ingest.Permanent(ReasonBadOutput, fmt.Errorf("%s: %w", p.emit.name, err))
	}
	for n := 0; rows.Next(); n++ {
		if err := rows.Scan(dest...); err != nil {
			return p.stmtError(p.emit, err)
		}
		o, err := s.output(p.plan.cfg.Topic)
		if err != nil {
			return ingest.Permanent(ReasonBadOutput, fmt.Errorf("%s: row %d: %w", p.emit.name, n+1, err))
		}
		if err := tx.Emit(ctx, o); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return p.stmtError(p.emit, err)
	}
	return nil
}

// cell holds one column's value as the driver gave it: int64, float64,
// string, []byte or nil.
type cell struct{ v any }

// Scan implements sql.Scanner.
func (c *cell) Scan(src any) error {
	c.v = src
	return nil
}

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
