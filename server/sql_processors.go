package server

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// ProcessorConfig is one entry of the configuration's "processors"
// section: a processor declared in the file, which a feed names by the
// entry's key (`processor: NAME`). Its kind is "sql": the fields are
// sqlproc.Config's (input, columns, setup, reject, apply, emit, ...).
type ProcessorConfig struct {
	sqlproc.Config `yaml:",inline"`
}

// validateProcessors checks what the "processors" section can be checked
// for without a database: each entry's kind, name and statements as far
// as sqlproc.Config.Validate goes. Compiling the statements waits for the
// start (newSQLProcessor), so that `server config` stays quick.
func (c *Config) validateProcessors() error {
	names := make([]string, 0, len(c.Processors))
	for name := range c.Processors {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		pc := c.Processors[name]
		switch {
		case pc == nil:
			return fmt.Errorf("processors.%s: no settings: want kind: %s and its statements", name, sqlproc.Kind)
		case !validName(name):
			return fmt.Errorf("processors.%s: a name is letters, digits, '.', '_' and '-'", name)
		case c.processors().check(name) == nil:
			return fmt.Errorf("processors.%s: the name is the registered processor %s's; give it another", name, name)
		case pc.Kind != sqlproc.Kind:
			return fmt.Errorf("processors.%s: kind %q, want %q", name, pc.Kind, sqlproc.Kind)
		}
		if err := pc.sqlConfig(name, "").Validate(); err != nil {
			return fmt.Errorf("processors.%w", trimKind(err))
		}
	}
	return nil
}

// fillProcessors writes an entry's empty maps as none, so that a
// configuration printed by `server config` (which writes none as {})
// reads back the same.
func (c *Config) fillProcessors() {
	if len(c.Processors) == 0 {
		c.Processors = nil
	}
	for _, pc := range c.Processors {
		if pc == nil {
			continue
		}
		if len(pc.Fields) == 0 {
			pc.Fields = nil
		}
		if len(pc.Migrations) == 0 {
			pc.Migrations = nil
		}
		if len(pc.Reads) == 0 {
			pc.Reads = nil
		}
	}
}

// declaredProcessor reports whether name is a processor of the
// configuration's "processors" section.
func (c *Config) declaredProcessor(name string) bool {
	_, ok := c.Processors[name]
	return ok
}

// processorNames lists what a feed's processor may be, for an error.
func (c *Config) processorNames() string {
	names := c.processors().names()
	for name := range c.Processors {
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// sqlConfig is the entry as sqlproc reads it: named, with the feed's
// topic as the outputs' default topic unless the entry sets its own.
func (pc *ProcessorConfig) sqlConfig(name, feedTopic string) sqlproc.Config {
	sc := pc.Config
	sc.Name = name
	if sc.Topic == "" {
		sc.Topic = feedTopic
	}
	return sc
}

// newSQLProcessor makes feed's processor from the "processors" entry it
// names. It compiles every statement against a scratch database (the
// real one is not yet claimed), so a statement that does not compile,
// names an unknown parameter or table, lacks an output column or writes
// outboxd's tables is a *ConfigError of one line naming the processor and
// the statement: the start fails with exit code 2.
func newSQLProcessor(feed string, fc *FeedConfig, c Config) (ingest.Processor, error) {
	sc, err := c.resolvedSQLConfig(fc.Processor, fc.Topic, nil)
	if err != nil {
		return nil, &ConfigError{Err: fmt.Errorf("feed %s: processors.%s: %w", feed, fc.Processor, err)}
	}
	newProc := sqlproc.New
	if outbox.IsPostgres(c.DB) {
		newProc = sqlproc.NewPostgres // its statements are PREPAREd on the database at Setup
	}
	p, err := newProc(sc)
	if err != nil {
		return nil, &ConfigError{Err: fmt.Errorf("feed %s: processors.%w", feed, trimKind(err))}
	}
	return p, nil
}

// trimKind drops the "sqlproc " that starts sqlproc's errors, which the
// "processors." before them says already.
func trimKind(err error) error {
	if msg, ok := strings.CutPrefix(err.Error(), "sqlproc "); ok {
		return wrapped{msg: msg, err: err}
	}
	return err
}

type wrapped struct {
	msg string
	err error
}

func (w wrapped) Error() string { return w.msg }
func (w wrapped) Unwrap() error { return w.err }

// checkSQLProcessors compiles every feed's SQL processor, before the
// database is opened, so a mistake in one fails the start (a *ConfigError)
// with nothing created. build makes them again for the loops; the check
// takes about 10 ms a processor.
func (m *Main) checkSQLProcessors() error {
	for _, name := range m.Config.FeedNames() {
		fc := m.Config.Feeds[name]
		if !m.Config.declaredProcessor(fc.Processor) {
			continue
		}
		if _, err := newSQLProcessor(name, fc, m.Config); err != nil {
			return err
		}
	}
	return nil
}

// guardSQL installs the SQL guard on the store when a feed runs a SQL
// processor: it keeps user SQL out of outboxd's tables at run time, and a
// SQL processor refuses to start on a store without it. It runs before
// any loop, while no transaction is open.
func (m *Main) guardSQL(ctx context.Context, s *outbox.Store) error {
	if s.Postgres() {
		return m.checkSQLOnPostgres(ctx, s)
	}
	for _, fc := range m.Config.Feeds {
		if m.Config.declaredProcessor(fc.Processor) {
			return sqlproc.Guard(ctx, s)
		}
	}
	return nil
}

// checkSQLOnPostgres runs, on a PostgreSQL store, each SQL processor's
// Setup in a transaction rolled back at once: SQLite's authorizer has no
// counterpart there, and its statements are PostgreSQL's, which only the
// database can judge (see sqlproc.NewPostgres). What Setup refuses (a
// statement PostgreSQL cannot PREPARE, one the guard refuses) is a
// *ConfigError of one line: the start fails with exit code 2, nothing
// created.
func (m *Main) checkSQLOnPostgres(ctx context.Context, s *outbox.Store) error {
	for _, name := range m.Config.FeedNames() {
		fc := m.Config.Feeds[name]
		if !m.Config.declaredProcessor(fc.Processor) {
			continue
		}
		p, err := newSQLProcessor(name, fc, m.Config)
		if err != nil {
			return err
		}
		su, ok := p.(ingest.Setupper)
		if !ok {
			continue
		}
		tx, err := s.Begin(ctx)
		if err != nil {
			return fmt.Errorf("feed %s: check the SQL processor: %w", name, err)
		}
		err = su.Setup(ctx, tx)
		tx.Rollback()
		if err != nil {
			return &ConfigError{Err: fmt.Errorf("feed %s: processors.%w", name, trimKind(err))}
		}
	}
	return nil
}

// resolvedSQLConfig is processor name's sqlConfig with its reads resolved
// into the processors they name, theirs in turn (path: the processors
// that read this one, to refuse a cycle). A reads entry is a feed's name
// (every table of its processor) or FEED.TABLE.
func (c Config) resolvedSQLConfig(name, feedTopic string, path []string) (sqlproc.Config, error) {
	sc := c.Processors[name].sqlConfig(name, feedTopic)
	if len(sc.ReadFrom) > 0 {
		return sc, nil // a recorded definition: resolved when it was recorded
	}
	path = append(path, name)
	whole := map[string]bool{}
	for _, r := range sc.Reads {
		feed, table := r, ""
		if _, ok := c.Feeds[r]; !ok {
			if i := strings.LastIndexByte(r, '.'); i > 0 {
				feed, table = r[:i], r[i+1:]
			}
		}
		fc, ok := c.Feeds[feed]
		switch {
		case !ok || fc == nil:
			return sc, fmt.Errorf("reads: %q names no feed (FEED or FEED.TABLE; feeds: %s)", r, strings.Join(c.FeedNames(), ", "))
		case !c.declaredProcessor(fc.Processor):
			return sc, fmt.Errorf("reads: feed %s's processor %s is not a SQL processor: only a SQL processor's tables are read", feed, fc.Processor)
		case slices.Contains(path, fc.Processor):
			return sc, fmt.Errorf("reads: feed %s's processor %s reads this one: %s", feed, fc.Processor, strings.Join(append(path, fc.Processor), " -> "))
		}
		i := slices.IndexFunc(sc.ReadFrom, func(s sqlproc.ReadSource) bool { return s.Feed == feed })
		if i < 0 {
			src, err := c.resolvedSQLConfig(fc.Processor, fc.Topic, path)
			if err != nil {
				return sc, fmt.Errorf("feed %s: %w", feed, err)
			}
			sc.ReadFrom = append(sc.ReadFrom, sqlproc.ReadSource{Feed: feed, Config: src})
			i = len(sc.ReadFrom) - 1
		}
		if table == "" {
			whole[feed] = true
			continue
		}
		sc.ReadFrom[i].Tables = append(sc.ReadFrom[i].Tables, table)
	}
	for i := range sc.ReadFrom {
		if whole[sc.ReadFrom[i].Feed] {
			sc.ReadFrom[i].Tables = nil
		}
	}
	return sc, nil
}
