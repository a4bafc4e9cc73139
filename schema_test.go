package outboxd

import (
	"strings"
	"testing"
)

func TestParseMigrations(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		src := "-- header comment, dropped\n" +
			"-- migration: 1\n" +
			"CREATE TABLE a (x INTEGER);\n" +
			"-- migration: 2\n" +
			"CREATE TABLE b (y INTEGER);\n" +
			"-- a comment inside 2\n"
		ms, err := parseMigrations(src)
		if err != nil {
			t.Fatal(err)
		}
		want := []Migration{
			{Version: 1, SQL: "CREATE TABLE a (x INTEGER);\n"},
			{Version: 2, SQL: "CREATE TABLE b (y INTEGER);\n-- a comment inside 2\n"},
		}
		if len(ms) != len(want) {
			t.Fatalf("got %d migrations, want %d: %+v", len(ms), len(want), ms)
		}
		for i := range want {
			if ms[i] != want[i] {
				t.Errorf("migration %d = %+v, want %+v", i, ms[i], want[i])
			}
		}
	})

	t.Run("OKMarkerSpacesTrimmed", func(t *testing.T) {
		ms, err := parseMigrations("-- migration: 1  \r\nSELECT 1;")
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 1 || ms[0].Version != 1 || ms[0].SQL != "SELECT 1;" {
			t.Fatalf("got %+v", ms)
		}
	})

	errCases := []struct {
		name, src, err string
	}{
		{"ErrGap", "-- migration: 1\nA;\n-- migration: 3\nB;\n", "schema.sql: migration 3 follows 1"},
		{"ErrDuplicate", "-- migration: 1\nA;\n-- migration: 1\nB;\n", "schema.sql: migration 1 follows 1"},
		{"ErrStartsAtTwo", "-- migration: 2\nA;\n", "schema.sql: migration 2 follows 0"},
		{"ErrStartsAtZero", "-- migration: 0\nA;\n", "schema.sql: migration 0 follows 0"},
		{"ErrNotANumber", "-- migration: one\nA;\n", `schema.sql: bad migration marker "-- migration: one"`},
		{"ErrEmptyNumber", "-- migration: \nA;\n", `schema.sql: bad migration marker "-- migration:"`},
		{"ErrNoMarker", "CREATE TABLE a (x INTEGER);\n", "schema.sql: no migrations"},
		// Without the space after the colon the line is not a marker.
		{"ErrMarkerWithoutSpace", "-- migration:1\nA;\n", "schema.sql: no migrations"},
		{"ErrEmpty", "", "schema.sql: no migrations"},
	}
	for _, c := range errCases {
		t.Run(c.name, func(t *testing.T) {
			ms, err := parseMigrations(c.src)
			if err == nil {
				t.Fatalf("no error; got %+v", ms)
			}
			if err.Error() != c.err {
				t.Fatalf("error = %q, want %q", err, c.err)
			}
			if ms != nil {
				t.Fatalf("migrations = %+v, want nil", ms)
			}
		})
	}
}

func TestMigrations(t *testing.T) {
	ms := Migrations()
	if len(ms) == 0 {
		t.Fatal("no migrations")
	}
	for i, m := range ms {
		if m.Version != i+1 {
			t.Errorf("migration %d has version %d", i, m.Version)
		}
		if strings.TrimSpace(m.SQL) == "" {
			t.Errorf("migration %d has no SQL", m.Version)
		}
		if strings.Contains(m.SQL, migrationMarker) {
			t.Errorf("migration %d holds a marker", m.Version)
		}
	}
	// The first migration creates every table the store relies on.
	for _, table := range []string{"meta", "feeds", "positions", "outbox", "dead_letters", "losses", "relay_progress", "ledger_balances"} {
		if !strings.Contains(ms[0].SQL, "CREATE TABLE "+table+" (") {
			t.Errorf("migration 1 does not create table %s", table)
		}
	}
	// The comment block above the first marker is not part of any migration.
	if strings.Contains(ms[0].SQL, "outboxd's whole SQLite schema") {
		t.Error("migration 1 holds the file's header comment")
	}
}
