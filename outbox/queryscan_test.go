package outbox_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// TestCheckQueryText: a query's parameters are the names SQLite binds
// (the sqllex tokens the SQL processors use too), none of them inside a
// string, a quoted name or a comment, an open comment at the end included.
func TestCheckQueryText(t *testing.T) {
	for _, c := range []struct {
		text string
		want []string
	}{
		{"SELECT :a, @b, $c, :a", []string{"a", "b", "c"}},
		{"SELECT :a$b, $t::u(v) AS x", []string{"a$b", "t::u(v)"}},
		{"SELECT ':x', \":y\", [:z] -- :w\n, /* :v */ :u", []string{"u"}},
		{"WITH \"select\" AS (SELECT :k) SELECT * FROM \"select\"; /* :open", []string{"k"}},
	} {
		got, err := outbox.CheckQueryText(c.text)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("CheckQueryText(%q) = %q, %v; want %q", c.text, got, err, c.want)
		}
	}
	for _, text := range []string{"SELECT 1; 'x'", "SELECT [a", "SELECT :1"} {
		if _, err := outbox.CheckQueryText(text); !errors.Is(err, outbox.ErrQueryRefused) {
			t.Errorf("CheckQueryText(%q): %v, want ErrQueryRefused", text, err)
		}
	}
}
