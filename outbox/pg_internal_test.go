package outbox

import "testing"

func TestRebindPG(t *testing.T) {
	for in, want := range map[string]string{
		"SELECT 1":                           "SELECT 1",
		"a = ? AND b = ?":                    "a = $1 AND b = $2",
		"a = ?2 AND b = ? AND c = ?1":        "a = $2 AND b = $3 AND c = $1",
		"x = '?' AND y = ? -- ?\nAND z = ?":  "x = '?' AND y = $1 -- ?\nAND z = $2",
		`"a?b" = ? /* ? */ AND 'it''s?' = ?`: `"a?b" = $1 /* ? */ AND 'it''s?' = $2`,
		"a = $1 AND b = $2":                  "a = $1 AND b = $2",
	} {
		if got := rebindPG(in); got != want {
			t.Errorf("rebindPG(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every statement pgDialect translates is one the SQLite engine runs as
// is: an entry keyed by a text no method uses would be dead.
func TestPGDialect_KeysDiffer(t *testing.T) {
	for lite, pg := range pgDialect {
		if lite == pg {
			t.Errorf("pgDialect maps %q to itself", firstLine(lite))
		}
	}
}
