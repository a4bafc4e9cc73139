package sqlproc

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/outbox"
)

// ReadSource is another feed's SQL processor whose tables a processor
// reads (Config.Reads), never writes.
//
// Start order: a processor's Setup first runs the setup and the pending
// migrations of every processor it reads, under their own names (both
// are idempotent: setup creates what is missing, a migration runs once),
// then its own; so its statements compile whichever feed starts first.
//
// Snapshot: outboxd's database has one writer, and an item's statements
// run in the transaction of its batch; a read sees the other feed's state
// as of its last commit before that transaction began (the other feed's
// later batches commit after it).
type ReadSource struct {
	// Feed is the feed whose processor this is, for errors.
	Feed string
	// Config is that processor's configuration (its Name set).
	Config Config
	// Tables are the tables read; none: every table its setup and
	// migrations make.
	Tables []string
}

// readPlan is a ReadSource compiled.
type readPlan struct {
	src  ReadSource
	plan *plan
}

func (c Config) readPlans() ([]readPlan, error) {
	var rs []readPlan
	for _, src := range c.ReadFrom {
		if src.Config.Name == c.Name {
			return nil, fmt.Errorf("sqlproc %s: reads: feed %s runs this processor itself", c.Name, src.Feed)
		}
		p, err := src.Config.compile()
		if err != nil {
			return nil, fmt.Errorf("sqlproc %s: reads: feed %s: %w", c.Name, src.Feed, err)
		}
		rs = append(rs, readPlan{src: src, plan: p})
	}
	return rs, nil
}

// prepare runs, in tx, the setup statements and the pending migrations of
// p's read sources (theirs first), then p's own.
func (p *plan) prepare(ctx context.Context, tx *outbox.Tx) error {
	for _, r := range p.reads {
		if err := r.plan.prepare(ctx, tx); err != nil {
			return fmt.Errorf("sqlproc %s: reads: feed %s: %w", p.cfg.Name, r.src.Feed, err)
		}
	}
	for i, s := range p.setup {
		if _, err := tx.Exec(ctx, s.text); err != nil {
			return fmt.Errorf("sqlproc %s: %s: %s", p.cfg.Name, stmtName("setup", i, len(p.setup), s.text), sqliteMessage(err))
		}
	}
	return p.migrate(ctx, tx)
}

// foreignTable is a table of a read source, as the guard judges it.
type foreignTable struct {
	feed     string
	readable bool // Reads lists it (or the whole feed)
}

// checkReads makes, in the scratch database, what p's read sources make
// (their setup and migrations, and their own sources'), and returns
// their tables by lower-case name. A table Reads names that they do not
// make is an error. done holds the processors whose setup ran already.
func (p *plan) checkReads(ctx context.Context, s *outbox.Store, g *guard, done map[string]bool) (map[string]foreignTable, error) {
	foreign := map[string]foreignTable{}
	for _, r := range p.reads {
		if _, err := r.plan.checkReads(ctx, s, g, done); err != nil {
			return nil, fmt.Errorf("sqlproc %s: reads: feed %s: %w", p.cfg.Name, r.src.Feed, err)
		}
		before, err := tableNames(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
		}
		if !done[r.plan.cfg.Name] {
			done[r.plan.cfg.Name] = true
			if err := r.plan.checkSetup(ctx, s, g); err != nil {
				return nil, fmt.Errorf("sqlproc %s: reads: feed %s: %w", p.cfg.Name, r.src.Feed, err)
			}
		}
		after, err := tableNames(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
		}
		var made []string
		for _, t := range after {
			if !slices.Contains(before, t) {
				made = append(made, t)
			}
		}
		for _, t := range r.src.Tables {
			if !slices.ContainsFunc(made, func(m string) bool { return strings.EqualFold(m, t) }) {
				return nil, fmt.Errorf("sqlproc %s: reads: feed %s's processor %s makes no table %s (its tables: %s)",
					p.cfg.Name, r.src.Feed, r.src.Config.Name, t, strings.Join(made, ", "))
			}
		}
		for _, t := range made {
			readable := len(r.src.Tables) == 0 || slices.ContainsFunc(r.src.Tables, func(m string) bool { return strings.EqualFold(m, t) })
			foreign[strings.ToLower(t)] = foreignTable{feed: r.src.Feed, readable: readable}
		}
	}
	return foreign, nil
}

// tableNames are the tables and views of s's main schema, sorted.
func tableNames(ctx context.Context, s *outbox.Store) ([]string, error) {
	objs, err := schemaObjects(ctx, s)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, o := range objs {
		if o.Type == "table" || o.Type == "view" {
			names = append(names, o.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}
