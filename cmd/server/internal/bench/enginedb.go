package bench

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// engineDB is where an engine phase's server keeps its store: the file
// name in the bench's directory, or with --db a database of that name on
// the PostgreSQL server (outboxd_bench_ and the name, its dots and dashes
// as _), dropped and created again so that each run starts empty. A
// database the bench cannot make is a failure of the run, reported by
// the phase's server.
func (b *bench) engineDB(name string) string {
	if b.o.DB == "" {
		return b.path(name)
	}
	db := "outboxd_bench_" + strings.NewReplacer(".", "_", "-", "_").Replace(strings.TrimSuffix(name, ".db"))
	if err := recreateDB(b.o.DB, db); err != nil {
		b.log.Error("bench: --db", "err", err)
	}
	u, err := url.Parse(b.o.DB)
	if err != nil {
		return b.o.DB
	}
	u.Path = "/" + db
	return u.String()
}

// recreateDB drops database name on the server of dsn, when it is there,
// and creates it empty.
func recreateDB(dsn, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect to make database %s: %w", name, err)
	}
	defer c.Close(context.Background())
	id := pgx.Identifier{name}.Sanitize()
	if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	if _, err := c.Exec(ctx, "CREATE DATABASE "+id); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}
