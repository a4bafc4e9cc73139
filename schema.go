// Package outboxd holds what the whole module shares: the SQLite schema.
//
// The service itself is in the packages below this one: outbox (the SQLite
// store, the only package with a database handle), ingest (the loop, with
// its feeds and processors in packages of their own below it), relay
// (outbox to Kafka), api (HTTP), server (configuration, wiring and
// signals: the whole service as a library) and cmd/server (the binary);
// internal/ holds what the binary needs and no library user should.
package outboxd

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"
)

//go:embed schema.sql
var schemaSQL string

// schemaPGSQL is the same migrations in PostgreSQL's dialect.
//
//go:embed schema_pg.sql
var schemaPGSQL string

// Migration is one numbered step of the schema.
type Migration struct {
	Version int
	SQL     string
}

const migrationMarker = "-- migration: "

// Migrations returns the schema's migrations in order. It panics if
// schema.sql is not numbered 1, 2, 3, ... since that is a build defect.
func Migrations() []Migration {
	ms, err := parseMigrations(schemaSQL)
	if err != nil {
		panic(err)
	}
	return ms
}

// PGMigrations returns the schema's migrations in PostgreSQL's dialect
// (schema_pg.sql): as many as Migrations, under the same numbers. It
// panics if the file is misnumbered or holds another count than
// schema.sql, since that is a build defect.
func PGMigrations() []Migration {
	ms, err := parseMigrations(schemaPGSQL)
	if err != nil {
		panic(fmt.Errorf("schema_pg.sql: %w", err))
	}
	if n := len(Migrations()); len(ms) != n {
		panic(fmt.Errorf("schema_pg.sql holds %d migrations, schema.sql %d", len(ms), n))
	}
	return ms
}

func parseMigrations(src string) ([]Migration, error) {
	var ms []Migration
	var cur *Migration
	for _, line := range strings.SplitAfter(src, "\n") {
		if rest, ok := strings.CutPrefix(line, migrationMarker); ok {
			v, err := strconv.Atoi(strings.TrimSpace(rest))
			if err != nil {
				return nil, fmt.Errorf("schema.sql: bad migration marker %q", strings.TrimSpace(line))
			}
			if v != len(ms)+1 {
				return nil, fmt.Errorf("schema.sql: migration %d follows %d", v, len(ms))
			}
			ms = append(ms, Migration{Version: v})
			cur = &ms[len(ms)-1]
			continue
		}
		if cur != nil {
			cur.SQL += line
		}
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("schema.sql: no migrations")
	}
	return ms, nil
}
