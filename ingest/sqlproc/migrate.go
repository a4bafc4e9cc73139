package sqlproc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Migration is one version of a processor's tables: statements run once,
// after setup, in the transaction that records the version and the SHA-256
// of SQL in outboxd's table processor_migrations. Versions run in
// ascending order; a start whose configuration changed the SQL of a
// version that ran, lacks a version that ran, or adds one below the
// highest that ran, is refused.
type Migration struct {
	// Version orders the migrations: a positive integer, each once.
	Version int64 `yaml:"version" usage:"a migration's version: a positive integer, the list in ascending order"`
	// SQL holds the statements, with no parameters (ALTER TABLE ... ADD
	// COLUMN, CREATE INDEX, UPDATE ...).
	SQL string `yaml:"sql" usage:"the migration's statements, run once (ALTER TABLE ... ADD COLUMN ...); no parameters"`
}

// migration is a Migration checked and cut into statements.
type migration struct {
	version int64
	stmts   []statement
	sum     string // hex SHA-256 of the SQL, white space around it trimmed
}

func (m migration) field() string { return "migration " + strconv.FormatInt(m.version, 10) }

// migrations checks c's migrations: versions positive and ascending, each
// with statements that take no parameters.
func (c Config) migrations() ([]migration, error) {
	var ms []migration
	for i, m := range c.Migrations {
		switch {
		case m.Version <= 0:
			return nil, fmt.Errorf("sqlproc %s: migrations[%d]: version %d: want a positive integer", c.Name, i, m.Version)
		case i > 0 && m.Version <= c.Migrations[i-1].Version:
			return nil, fmt.Errorf("sqlproc %s: migrations[%d]: version %d follows %d: list the versions in ascending order, each once",
				c.Name, i, m.Version, c.Migrations[i-1].Version)
		}
		mg := migration{version: m.Version, sum: sqlSum(m.SQL)}
		var err error
		if mg.stmts, err = c.statements(mg.field(), m.SQL, nil); err != nil {
			return nil, err
		}
		if len(mg.stmts) == 0 {
			return nil, fmt.Errorf("sqlproc %s: %s: no statement", c.Name, mg.field())
		}
		ms = append(ms, mg)
	}
	return ms, nil
}

// sqlSum is the hex SHA-256 of a migration's SQL, white space around it
// trimmed (YAML's block scalars add a line break).
func sqlSum(src string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(src)))
	return hex.EncodeToString(sum[:])
}

// appliedMigration is a row of processor_migrations.
type appliedMigration struct {
	Version int64  `db:"version"`
	Sum     string `db:"sha256"`
}

// migrate runs the migrations of p that have not run on tx's database, in
// order, each recorded in tx. It refuses, changing nothing, when a version
// that ran has other SQL now, when the database has versions p lacks (the
// configuration is older than the database), or when a new version is
// below one that ran.
func (p *plan) migrate(ctx context.Context, tx *outbox.Tx) error {
	name := p.cfg.Name
	var done []appliedMigration
	if err := tx.Select(ctx, &done, `SELECT version, sha256 FROM processor_migrations WHERE processor = ? ORDER BY version`, name); err != nil {
		return fmt.Errorf("sqlproc %s: read the migrations that ran: %w", name, err)
	}
	byVersion := map[int64]migration{}
	for _, m := range p.migs {
		byVersion[m.version] = m
	}
	ran := map[int64]bool{}
	var newer []string
	var top int64
	for _, d := range done {
		ran[d.Version] = true
		top = max(top, d.Version)
		m, ok := byVersion[d.Version]
		if !ok {
			newer = append(newer, strconv.FormatInt(d.Version, 10))
			continue
		}
		if m.sum != d.Sum {
			return fmt.Errorf("sqlproc %s: %s: its SQL changed after it ran (sha256 %.12s ran, %.12s now): a migration runs once; put the change in a new version",
				name, m.field(), d.Sum, m.sum)
		}
	}
	if len(newer) > 0 {
		return fmt.Errorf("sqlproc %s: the database has migrations the configuration lacks (%s): the configuration is older than the database; start with one that has them",
			name, strings.Join(newer, ", "))
	}
	for _, m := range p.migs {
		if ran[m.version] {
			continue
		}
		if m.version < top {
			return fmt.Errorf("sqlproc %s: %s is new but migration %d ran already: migrations run in order; give it a version above %d",
				name, m.field(), top, top)
		}
		for i, s := range m.stmts {
			if _, err := tx.Exec(ctx, s.text); err != nil {
				return fmt.Errorf("sqlproc %s: %s: %s", name, stmtName(m.field(), i, len(m.stmts), s.text), sqliteMessage(err))
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO processor_migrations (processor, version, sha256, at) VALUES (?, ?, ?, ?)`,
			name, m.version, m.sum, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("sqlproc %s: record %s: %w", name, m.field(), err)
		}
	}
	return nil
}
