package sqlproc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"modernc.org/sqlite"

	"github.com/outboxd/outboxd/outbox"
)

// Check validates c (see Validate), then compiles every statement against
// a scratch database that holds outboxd's schema and what c's setup made,
// under the guard's rule for user SQL: a statement that does not compile,
// names a table or column that does not exist, uses a parameter that does
// not exist, writes outboxd's tables (directly or through a trigger it
// fires), controls transactions or sets a pragma; an emit without the
// output's columns or a reject without a reason column; an apply statement
// that returns rows: each is an error of one line naming the processor and
// the statement. The setup runs in the scratch database only.
func Check(ctx context.Context, c Config) error {
	p, err := c.compile()
	if err != nil {
		return err
	}
	return p.check(ctx)
}

func (p *plan) check(ctx context.Context) error {
	set, err := protected()
	if err != nil {
		return fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
	}
	return withScratch(ctx, func(s *outbox.Store) error {
		g := &guard{set: set}
		if err := s.SetAuthorizer(ctx, g.allowUser); err != nil {
			return fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
		}
		foreign, err := p.checkReads(ctx, s, g, map[string]bool{})
		if err != nil {
			return err
		}
		g.foreign = foreign
		if err := p.checkSetup(ctx, s, g); err != nil {
			return err
		}
		if err := p.checkWindowTable(ctx, s); err != nil {
			return err
		}
		if p.window != nil {
			if err := p.checkQuery(ctx, s, g, "window.time", 0, 1, *p.window.time); err != nil {
				return err
			}
		}
		if p.reject != nil {
			if err := p.checkQuery(ctx, s, g, "reject", 0, 1, *p.reject); err != nil {
				return err
			}
		}
		for i, st := range p.apply {
			if err := p.checkQuery(ctx, s, g, "apply", i, len(p.apply), st); err != nil {
				return err
			}
		}
		if p.emit != nil {
			return p.checkQuery(ctx, s, g, "emit", 0, 1, *p.emit)
		}
		return nil
	})
}

// checkSetup runs the setup statements, then the migrations', in the
// scratch database.
func (p *plan) checkSetup(ctx context.Context, s *outbox.Store, g *guard) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
	}
	defer tx.Rollback()
	for i, st := range p.setup {
		denied, err := g.asUser(func() error {
			_, err := tx.Exec(ctx, st.text)
			return err
		})
		if err != nil {
			return p.stmtFailed("setup", i, len(p.setup), st, denied, err)
		}
	}
	for _, m := range p.migs {
		for i, st := range m.stmts {
			denied, err := g.asUser(func() error {
				_, err := tx.Exec(ctx, st.text)
				return err
			})
			if err != nil {
				return p.stmtFailed(m.field(), i, len(m.stmts), st, denied, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlproc %s: setup: %w", p.cfg.Name, err)
	}
	return nil
}

// checkQuery compiles a statement of reject, apply or emit, without
// running it, and checks its result columns.
func (p *plan) checkQuery(ctx context.Context, s *outbox.Store, g *guard, field string, i, n int, st statement) error {
	if err := p.compileIn(ctx, s, g, field, i, n, st); err != nil {
		return err
	}
	var cols []string
	denied, err := g.asUser(func() (err error) {
		cols, err = s.ColumnNames(ctx, st.text)
		return err
	})
	if err != nil {
		return p.stmtFailed(field, i, n, st, denied, err)
	}
	if err := p.checkColumns(field, cols); err != nil {
		return fmt.Errorf("sqlproc %s: %s: %v", p.cfg.Name, stmtName(field, i, n, st.text), err)
	}
	return nil
}

// compileIn compiles st in a transaction of s by EXPLAINing it with every
// parameter the processor knows bound to NULL: SQLite itself then says
// whether the statement compiles and whether it uses a parameter that does
// not exist.
func (p *plan) compileIn(ctx context.Context, s *outbox.Store, g *guard, field string, i, n int, st statement) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
	}
	defer tx.Rollback()
	args := make([]any, len(p.params))
	for i, name := range p.params {
		args[i] = sql.Named(name, nil)
	}
	denied, err := g.asUser(func() error {
		_, err := tx.Exec(ctx, "EXPLAIN "+st.text, args...)
		return err
	})
	if err != nil {
		return p.stmtFailed(field, i, n, st, denied, err)
	}
	return nil
}

func (p *plan) checkColumns(field string, cols []string) error {
	switch field {
	case "apply":
		if len(cols) > 0 {
			return fmt.Errorf("returns rows (columns %s), which apply would throw away: outputs come from emit", strings.Join(cols, ", "))
		}
	case "reject":
		if len(cols) == 0 || len(cols) > 2 {
			return fmt.Errorf("returns %d columns, want the reason and, optionally, the error", len(cols))
		}
	case "emit":
		return p.checkEmitColumns(cols)
	case "window.time":
		if len(cols) != 1 {
			return fmt.Errorf("returns %d columns, want the event time", len(cols))
		}
	}
	return nil
}

func (p *plan) checkEmitColumns(cols []string) error {
	seen := map[string]bool{}
	for _, c := range cols {
		if !slices.Contains(outputCols[:], c) {
			return fmt.Errorf("column %q is not one of topic, key, value, headers (name columns with AS)", c)
		}
		if seen[c] {
			return fmt.Errorf("column %q comes twice", c)
		}
		seen[c] = true
	}
	for _, c := range []string{ColKey, ColValue} {
		if !seen[c] {
			return fmt.Errorf("no column %q (columns: %s)", c, strings.Join(cols, ", "))
		}
	}
	if !seen[ColTopic] && p.cfg.Topic == "" {
		return errors.New(`no column "topic", and the processor has no default topic`)
	}
	return nil
}

// stmtFailed is the one-line error of a statement that failed to compile
// or run in the scratch database.
func (p *plan) stmtFailed(field string, i, n int, st statement, denied string, err error) error {
	msg := sqliteMessage(err)
	if denied != "" {
		msg = denied
	}
	return fmt.Errorf("sqlproc %s: %s: %s", p.cfg.Name, stmtName(field, i, n, st.text), msg)
}

// codeSuffix is the " (1)" the driver appends to SQLite's messages.
var codeSuffix = regexp.MustCompile(` \(\d+\)$`)

// sqliteMessage is SQLite's message without the driver's decorations, on
// one line.
func sqliteMessage(err error) string {
	if isPG(err) {
		return pgMessage(err)
	}
	var se *sqlite.Error
	msg := err.Error()
	if errors.As(err, &se) {
		msg = se.Error()
	}
	msg = codeSuffix.ReplaceAllString(msg, "")
	msg = strings.TrimPrefix(msg, "SQL logic error: ")
	if name, ok := strings.CutPrefix(msg, "missing named argument "); ok {
		msg = "unknown parameter :" + strings.Trim(name, `"`)
	}
	return strings.Join(strings.Fields(msg), " ")
}
