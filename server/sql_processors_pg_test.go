package server

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestSQLProcessor_PostgresStartCheck: on PostgreSQL the start PREPAREs a
// SQL processor's statements on the database (its Setup, rolled back):
// one PostgreSQL refuses is a *ConfigError of one line naming the feed,
// the processor and the statement, and nothing is created; a good one
// passes and leaves no table either.
func TestSQLProcessor_PostgresStartCheck(t *testing.T) {
	dsn := pgtest.New(t).DSN
	for apply, want := range map[string]string{
		`INSERT INTO nosuch (k) VALUES (:account)`:                   `feed f: processors.p: apply (INSERT INTO nosuch (k) VALUES (:account)): relation "nosuch" does not exist (SQLSTATE 42P01)`,
		`INSERT INTO t (k) VALUES (:account) ON CONFLICT DO NOTHING`: "",
	} {
		yml := `processors:
  p:
    kind: sql
    input: csv
    columns: [account]
    topic: p.out
    setup: CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY);
    apply: ` + apply + `
feeds:
  f: {source: "file:/var/log/f.csv", processor: p}
`
		c, err := ParseConfig([]string{"--config", writeYAML(t, yml), "--db", dsn}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		s, err := outbox.Open(context.Background(), outbox.DefaultConfig(dsn))
		if err != nil {
			t.Fatal(err)
		}
		m := &Main{Config: c}
		err = m.guardSQL(context.Background(), s)
		var ce *ConfigError
		switch {
		case want == "" && err != nil:
			t.Fatalf("%s: %v", apply, err)
		case want != "" && (!errors.As(err, &ce) || err.Error() != want):
			t.Fatalf("%s: %v (%T)\nwant the *ConfigError %s", apply, err, err, want)
		}
		var n int
		if err := outboxtest.Get(context.Background(), s, &n, `SELECT count(*) FROM pg_tables WHERE tablename = 't'`); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("%s: the check left table t", apply)
		}
		s.Close()
	}
}
