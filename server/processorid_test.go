package server

import (
	"testing"

	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// A SQL processor's fingerprint follows what gives its state its meaning,
// not its name nor what it emits; a built-in's kind is its name.
func TestProcessorID(t *testing.T) {
	base := sqlproc.Config{Kind: sqlproc.Kind, Input: "csv", Columns: []string{"account", "amount"},
		Setup: "CREATE TABLE IF NOT EXISTS b (a TEXT PRIMARY KEY, n INTEGER) STRICT",
		Apply: "INSERT INTO b VALUES (:account, :amount) ON CONFLICT (a) DO UPDATE SET n = n + excluded.n",
		Emit:  "SELECT :account AS key, :amount AS value"}
	id := func(name string, pc sqlproc.Config) outbox.ProcessorID {
		c := DefaultConfig()
		c.Processors = map[string]*ProcessorConfig{name: {Config: pc}}
		return c.processorID(&FeedConfig{Processor: name, Topic: "t"})
	}
	want := id("sql-ledger", base)
	if want.Kind != "sql" || len(want.Fingerprint) != 16 {
		t.Fatalf("id %+v, want kind sql and a 16-digit fingerprint", want)
	}
	same := map[string]func(sqlproc.Config) sqlproc.Config{
		"emit": func(c sqlproc.Config) sqlproc.Config { c.Emit = "SELECT 1 AS key, 2 AS value"; return c },
	}
	for what, change := range same {
		if got := id("sql-ledger", change(base)); got != want {
			t.Errorf("%s changed: %+v, want %+v", what, got, want)
		}
	}
	if got := id("renamed", base); got != want {
		t.Errorf("renamed: %+v, want %+v", got, want)
	}
	differs := map[string]func(sqlproc.Config) sqlproc.Config{
		"apply":   func(c sqlproc.Config) sqlproc.Config { c.Apply += " -- twice"; return c },
		"setup":   func(c sqlproc.Config) sqlproc.Config { c.Setup = ""; return c },
		"reject":  func(c sqlproc.Config) sqlproc.Config { c.Reject = "SELECT 'malformed' WHERE :amount < 0"; return c },
		"columns": func(c sqlproc.Config) sqlproc.Config { c.Columns = []string{"amount", "account"}; return c },
		"text":    func(c sqlproc.Config) sqlproc.Config { c.Text = []string{"account"}; return c },
		"trim":    func(c sqlproc.Config) sqlproc.Config { c.Trim = true; return c },
	}
	for what, change := range differs {
		if got := id("sql-ledger", change(base)); got == want {
			t.Errorf("%s changed, the fingerprint did not: %+v", what, got)
		}
	}
	c := DefaultConfig()
	if got := c.processorID(&FeedConfig{Processor: "ledger"}); got != (outbox.ProcessorID{Kind: "ledger"}) {
		t.Errorf("ledger: %+v", got)
	}
}
