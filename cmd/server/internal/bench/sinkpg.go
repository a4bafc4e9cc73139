package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL sink's shapes (with --postgres DSN): sink_postgres drains
// the ingest phase's outbox into a table, as the relay phase drains it to
// Kafka, timed from the first delivery to the last; sink_postgres_e2e runs
// file -> SQLite -> table on a fresh database, timed from the server's
// start until the sink's progress row covers every line. Both then check
// the table holds one row per line, no position twice.

// pgSchema holds the bench's tables in the --postgres database.
const pgSchema = "outboxd_bench"

// benchPG is the bench's connection to the --postgres database.
type benchPG struct {
	c *pgx.Conn
}

func (b *bench) openPG(ctx context.Context) (*benchPG, error) {
	c, err := pgx.Connect(ctx, b.o.Postgres)
	if err != nil {
		return nil, fmt.Errorf("--postgres: connect: %w", err)
	}
	if _, err := c.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgSchema); err != nil {
		c.Close(ctx)
		return nil, fmt.Errorf("--postgres: create schema %s: %w", pgSchema, err)
	}
	return &benchPG{c: c}, nil
}

// reset drops the phase's table and its sink's progress and refusals.
func (p *benchPG) reset(ctx context.Context, phase string) error {
	if _, err := p.c.Exec(ctx, `DROP TABLE IF EXISTS `+pgSchema+`.`+phase); err != nil {
		return fmt.Errorf("drop table %s.%s: %w", pgSchema, phase, err)
	}
	for _, t := range []string{"progress", "refused"} {
		if _, err := p.c.Exec(ctx, `DO $$ BEGIN IF to_regclass('`+pgSchema+`.`+t+`') IS NOT NULL THEN DELETE FROM `+pgSchema+`.`+t+` WHERE sink = '`+phase+`'; END IF; END $$`); err != nil {
			return fmt.Errorf("reset %s.%s: %w", pgSchema, t, err)
		}
	}
	return nil
}

// progress is the sink's progress row (0 before it is there).
func (p *benchPG) progress(ctx context.Context, phase string) (int64, error) {
	var id int64
	err := p.c.QueryRow(ctx, `SELECT coalesce((SELECT last_id FROM `+pgSchema+`.progress WHERE sink = $1), 0)`, phase).Scan(&id)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return 0, nil
	}
	return id, err
}

func (p *benchPG) close() { p.c.Close(context.Background()) }

// sinkConfig writes the server's configuration of the phase's sink and
// returns its path.
func (b *bench) sinkConfig(phase string) (string, error) {
	path := b.path(phase + ".yaml")
	yaml := fmt.Sprintf(`sinks:
  - name: %s
    url: %q
    options: {table: %s.%s, progress_table: %s.progress, refused_table: %s.refused, value: auto}
`, phase, b.o.Postgres, pgSchema, phase, pgSchema, pgSchema)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return "", fmt.Errorf("write the sink's configuration: %w", err)
	}
	return path, nil
}

// checkTable checks the phase's table holds one row per line.
func (b *bench) checkTable(ctx context.Context, pg *benchPG, phase string) {
	var n, positions int64
	err := pg.c.QueryRow(ctx, `SELECT count(*), count(DISTINCT position) FROM `+pgSchema+`.`+phase).Scan(&n, &positions)
	if err != nil {
		b.res.Verify.fail("%s: count the table: %v", phase, err)
		return
	}
	if n != b.data.Lines || positions != b.data.Lines {
		b.res.Verify.fail("%s: the table holds %d rows at %d positions, want %d of each", phase, n, positions, b.data.Lines)
	}
}

func (b *bench) runSinkPostgres(ctx context.Context) error {
	const phase = "sink_postgres"
	return b.pgSinkPhase(ctx, phase, &b.res.SinkPostgres, func(pg *benchPG, cfg string) (*phaseResult, error) {
		return b.timeBacklog(ctx, phase, engineSpec{db: b.backlog, source: "file:" + b.data.Path, topic: b.topic("relay"), relay: "none",
			extra: []string{"--config", cfg}}, "the PostgreSQL sink to deliver row %d",
			func(*engineRun) (int64, time.Time, error) {
				id, err := pg.progress(ctx, phase)
				return id, time.Time{}, err
			})
	})
}

func (b *bench) runSinkPostgresE2E(ctx context.Context) error {
	const phase = "sink_postgres_e2e"
	return b.pgSinkPhase(ctx, phase, &b.res.SinkPostgresE2E, func(pg *benchPG, cfg string) (*phaseResult, error) {
		s := engineSpec{db: b.engineDB(phase + ".db"), source: "file:" + b.data.Path, topic: b.topic("relay"), relay: "none",
			extra: []string{"--config", cfg}}
		res, _, err := b.timeEngine(ctx, phase, s, b.data.Lines, fmt.Sprintf("the PostgreSQL sink to deliver %d lines", b.data.Lines),
			func(*engineRun) (bool, error) {
				id, err := pg.progress(ctx, phase)
				return id >= b.data.Lines, err
			})
		return res, err
	})
}

// pgSinkPhase runs a phase of the PostgreSQL sink: on the phase's tables
// emptied, with the sink's configuration file, run measures it into *res;
// then the table is checked, and emptied again unless --keep.
func (b *bench) pgSinkPhase(ctx context.Context, phase string, res **phaseResult,
	run func(pg *benchPG, cfg string) (*phaseResult, error)) error {
	pg, err := b.openPG(ctx)
	if err != nil {
		return err
	}
	defer pg.close()
	if err := pg.reset(ctx, phase); err != nil {
		return err
	}
	cfg, err := b.sinkConfig(phase)
	if err != nil {
		return err
	}
	r, err := run(pg, cfg)
	if err != nil {
		return err
	}
	*res = r
	b.checkTable(ctx, pg, phase)
	if !b.o.Keep {
		return pg.reset(ctx, phase)
	}
	return nil
}
