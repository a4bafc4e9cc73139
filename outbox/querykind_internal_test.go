package outbox

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

// TestReadOnlyColumns_Kind: on the database, a statement is a query only
// when the first leave SQLite asks is to select. A write asks none when
// its table does not exist (or first looks its table up, a view it
// cannot modify), so it is refused whatever the tables; a SELECT of a
// table not there yet is only not ready. The text's own check is passed
// by, to see the database's.
func TestReadOnlyColumns_Kind(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, DefaultConfig(filepath.Join(t.TempDir(), "q.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for text, want := range map[string]string{
		`WITH x AS (SELECT 1) DELETE FROM balances`:                "refused: SQLite does not compile it as a SELECT (no such table: balances): a query may only read",
		`WITH x AS (SELECT 1) INSERT INTO missing SELECT * FROM x`: "refused: SQLite does not compile it as a SELECT (no such table: missing): a query may only read",
		`WITH x AS (SELECT 1) UPDATE missing SET a = 1`:            "refused: SQLite does not compile it as a SELECT (no such table: missing): a query may only read",
		`DELETE FROM outbox`:                                       "refused: SQLite does not compile it as a SELECT (cannot modify outbox because it is a view): a query may only read",
		`WITH x AS (SELECT 1) DELETE FROM dead_letters`:            "refused: writes dead_letters: a query may only read",
		`CREATE TABLE t (a)`:                                       "refused: writes sqlite_master: a query may only read",
		`SELECT v FROM later`:                                      "not ready: the database does not hold what it reads yet (no such table: later)",
		`WITH x AS (SELECT v FROM later) SELECT * FROM x`:          "not ready: the database does not hold what it reads yet (no such table: later)",
	} {
		_, err := s.readOnlyColumns(ctx, text)
		if err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
		if errors.Is(err, ErrQueryRefused) == errors.Is(err, ErrQueryNotReady) {
			t.Errorf("%q: %v is either refused or not ready", text, err)
		}
	}
	if cols, err := s.readOnlyColumns(ctx, `VALUES (1, 2)`); err != nil || len(cols) != 2 {
		t.Fatalf("VALUES: %v, %v", cols, err)
	}
}
