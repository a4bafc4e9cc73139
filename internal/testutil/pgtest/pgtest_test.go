package pgtest_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
)

func exists(t *testing.T, name string) bool {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pgtest.ServerDSN(t))
	testutil.Must(t, err)
	defer c.Close(ctx)
	var n int
	testutil.Must(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n))
	return n == 1
}

func TestNew_OwnDatabaseDroppedAtCleanup(t *testing.T) {
	var names []string
	for _, sub := range []string{"a", "b"} {
		t.Run(sub, func(t *testing.T) {
			db := pgtest.New(t)
			names = append(names, db.Name)
			if !strings.HasPrefix(db.Name, "outboxd_test_") || len(db.Name) > 63 {
				t.Fatalf("name %q: want the outboxd_test_ prefix within 63 bytes", db.Name)
			}
			c := db.Conn(t)
			var cur string
			testutil.Must(t, c.QueryRow(context.Background(), `SELECT current_database()`).Scan(&cur))
			testutil.Equal(t, "current_database()", cur, db.Name)
			_, err := c.Exec(context.Background(), `CREATE TABLE t (x int)`)
			testutil.Must(t, err)
			// A connection left open must not stop the drop.
			_ = db.Conn(t)
			if !exists(t, db.Name) {
				t.Fatalf("database %s not in pg_database", db.Name)
			}
		})
	}
	if len(names) != 2 || names[0] == names[1] {
		t.Fatalf("names %v: want two different ones", names)
	}
	for _, n := range names {
		if exists(t, n) {
			t.Fatalf("database %s still there after its test ended", n)
		}
	}
}

func TestNew_LongNameFits(t *testing.T) {
	t.Run(strings.Repeat("Very-Long Name/", 10), func(t *testing.T) {
		db := pgtest.New(t)
		if len(db.Name) > 63 {
			t.Fatalf("name %q is %d bytes, PostgreSQL keeps 63", db.Name, len(db.Name))
		}
		db.Conn(t)
	})
}

func TestWithDatabase(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u@h:1/postgres?sslmode=disable", "postgres://u@h:1/x?sslmode=disable"},
		{"host=/tmp user=u dbname=postgres", "host=/tmp user=u dbname=postgres dbname='x'"},
	} {
		got, err := pgtest.WithDatabase(c.in, "x")
		testutil.Must(t, err)
		testutil.Equal(t, "WithDatabase("+c.in+")", got, c.want)
		cfg, err := pgx.ParseConfig(got)
		testutil.Must(t, err)
		testutil.Equal(t, "database of "+got, cfg.Database, "x")
	}
}

func TestProxy_DownAndUp(t *testing.T) {
	db := pgtest.New(t)
	p, dsn := db.NewProxy(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	testutil.Must(t, err)
	defer c.Close(ctx)
	testutil.Must(t, c.Ping(ctx))

	p.Down()
	if err := c.Ping(ctx); err == nil {
		t.Fatal("ping through a proxy that is down succeeded")
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if c2, err := pgx.Connect(cctx, dsn); err == nil {
		c2.Close(ctx)
		t.Fatal("connect through a proxy that is down succeeded")
	}

	p.Up()
	c3, err := pgx.Connect(ctx, dsn)
	testutil.Must(t, err)
	defer c3.Close(ctx)
	var one int
	testutil.Must(t, c3.QueryRow(ctx, `SELECT 1`).Scan(&one))
	testutil.Equal(t, "SELECT 1", one, 1)
}

func TestServerDSN_EnvThatDoesNotAnswerFails(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		pgtest.ServerDSN(t)
		t.Log("ServerDSN returned")
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	testutil.Must(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDSN_EnvThatDoesNotAnswerFails$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1", pgtest.EnvDSN+"=postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=2")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("child passed with %s naming a closed port:\n%s", pgtest.EnvDSN, out)
	}
	if !strings.Contains(string(out), pgtest.EnvDSN+" is set but its server does not answer") || strings.Contains(string(out), "ServerDSN returned") {
		t.Fatalf("child output does not fail on the DSN:\n%s", out)
	}
}
