package outboxtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// OpenStore opens a store with cfg and closes it when the test ends; it
// fails the test when the store does not open.
func OpenStore(tb testing.TB, cfg outbox.Config) *outbox.Store {
	tb.Helper()
	s, err := outbox.Open(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// StoreAt is OpenStore with the default configuration on the SQLite file
// at path, whatever EnvStore says: for a test that opens the same file
// again (a restart) or shares it with another process.
func StoreAt(tb testing.TB, path string) *outbox.Store {
	tb.Helper()
	return OpenStore(tb, outbox.DefaultConfig(path))
}

// TempStore is OpenStore with the default configuration, on a new file in
// the test's temporary directory.
func TempStore(tb testing.TB) *outbox.Store {
	tb.Helper()
	return NewStore(tb, nil)
}

// EnvStore is the environment variable that selects the engine of the
// stores NewStore and TempStore open: "postgres" gives each test a
// PostgreSQL database of its own (pgtest), anything else a SQLite file.
// It runs a package's store tests against PostgreSQL unchanged:
// OUTBOXD_TEST_STORE=postgres go test ./outbox.
const EnvStore = "OUTBOXD_TEST_STORE"

// OnPostgres reports whether EnvStore selects PostgreSQL.
func OnPostgres() bool { return os.Getenv(EnvStore) == "postgres" }

// SQLiteOnly skips a test of what only the SQLite engine has (its file,
// its PRAGMAs, its WAL) when EnvStore selects PostgreSQL, in one line
// that says why: what the test checks that PostgreSQL has no counterpart
// of.
func SQLiteOnly(tb testing.TB, why string) {
	tb.Helper()
	if OnPostgres() {
		tb.Skip("SQLite only (" + EnvStore + "=postgres): " + why)
	}
}

// NewStore is OpenStore on a new file in the test's temporary directory
// (a new PostgreSQL database under EnvStore=postgres), with the default
// configuration changed by cfg (when not nil).
func NewStore(tb testing.TB, cfg func(*outbox.Config)) *outbox.Store {
	tb.Helper()
	c := outbox.DefaultConfig(filepath.Join(tb.TempDir(), "t.db"))
	if OnPostgres() {
		c.Path = pgtest.New(tb).DSN
	}
	if cfg != nil {
		cfg(&c)
	}
	return OpenStore(tb, c)
}
