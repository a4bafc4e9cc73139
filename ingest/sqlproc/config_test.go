package sqlproc_test

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest/sqlproc"
)

// csvConfig is a valid processor: change a field to break it.
func csvConfig() sqlproc.Config {
	return sqlproc.Config{
		Name:    "p",
		Input:   sqlproc.InputCSV,
		Columns: []string{"account", "amount"},
		Topic:   "p.out",
		Setup:   "CREATE TABLE IF NOT EXISTS t (account TEXT PRIMARY KEY, n INTEGER NOT NULL)",
		Apply:   "INSERT INTO t VALUES (:account, :amount) ON CONFLICT (account) DO UPDATE SET n = n + excluded.n",
		Emit:    "SELECT :account AS key, CAST(n AS TEXT) AS value FROM t WHERE account = :account",
	}
}

func TestConfig_Validate(t *testing.T) {
	if err := csvConfig().Validate(); err != nil {
		t.Fatalf("valid configuration: %v", err)
	}
	json := func(c *sqlproc.Config) {
		c.Input, c.Columns = sqlproc.InputJSON, nil
		c.Fields = map[string]string{"account": "$.account", "amount": "amount"}
	}
	for _, c := range []struct {
		name   string
		change func(c *sqlproc.Config)
		err    string
	}{
		{"ErrNoName", func(c *sqlproc.Config) { c.Name = "" }, "sqlproc: a processor needs a name"},
		{"ErrNameLines", func(c *sqlproc.Config) { c.Name = "a\nb" }, `sqlproc "a\nb": the name is not one line of text`},
		{"ErrKind", func(c *sqlproc.Config) { c.Kind = "go" }, `sqlproc p: kind "go" is not "sql"`},
		{"ErrNoInput", func(c *sqlproc.Config) { c.Input = "" }, "sqlproc p: input: missing, want one of csv, json, raw"},
		{"ErrInput", func(c *sqlproc.Config) { c.Input = "xml" }, `sqlproc p: input: "xml" is not one of csv, json, raw`},
		{"ErrNoColumns", func(c *sqlproc.Config) { c.Columns = nil }, "sqlproc p: input csv: columns: none named"},
		{"ErrColumnName", func(c *sqlproc.Config) { c.Columns = []string{"a b"} }, `sqlproc p: column "a b": a name is a letter, then letters, digits or _`},
		{"ErrColumnUnderscore", func(c *sqlproc.Config) { c.Columns = []string{"_a"} }, `sqlproc p: column "_a": a name is a letter, then letters, digits or _`},
		{"ErrColumnTaken", func(c *sqlproc.Config) { c.Columns = []string{"account", "position"} }, `sqlproc p: column "position": the name is taken by the delivery's parameter :position`},
		{"ErrColumnTwice", func(c *sqlproc.Config) { c.Columns = []string{"a", "a"} }, `sqlproc p: column "a": named twice`},
		{"ErrDelimiter", func(c *sqlproc.Config) { c.Delimiter = ",," }, `sqlproc p: delimiter: ",," is not one ASCII character other than a quote or a line break`},
		{"ErrDelimiterQuote", func(c *sqlproc.Config) { c.Delimiter = `"` }, `sqlproc p: delimiter: "\"" is not one ASCII character other than a quote or a line break`},
		{"ErrText", func(c *sqlproc.Config) { c.Text = []string{"acount"} }, `sqlproc p: text: "acount" is not one of the columns`},
		{"ErrQuoting", func(c *sqlproc.Config) { c.Quoting = "excel" }, `sqlproc p: quoting: "excel" is not one of rfc4180, none`},
		{"ErrCSVFields", func(c *sqlproc.Config) { c.Fields = map[string]string{"a": "a"} }, "sqlproc p: input csv: fields and required are for json input (csv has columns)"},
		{"ErrJSONColumns", func(c *sqlproc.Config) { json(c); c.Columns = []string{"a"} }, "sqlproc p: input json: columns, delimiter, quoting, trim and text are for csv input (json has fields)"},
		{"ErrJSONNoFields", func(c *sqlproc.Config) { json(c); c.Fields = nil }, "sqlproc p: input json: fields: none named"},
		{"ErrJSONPath", func(c *sqlproc.Config) { json(c); c.Fields["amount"] = "$..x" }, `sqlproc p: field amount: path "$..x": an empty member name`},
		{"ErrJSONRequired", func(c *sqlproc.Config) { json(c); c.Required = []string{"amout"} }, `sqlproc p: required: "amout" is not one of the fields`},
		{"ErrRawColumns", func(c *sqlproc.Config) { c.Input = sqlproc.InputRaw }, "sqlproc p: input raw decodes nothing: columns, text, fields and required do not apply"},
		{"ErrUnknownParameter", func(c *sqlproc.Config) { c.Apply = "INSERT INTO t VALUES (:acount, 1)" },
			"sqlproc p: apply (INSERT INTO t VALUES (:acount, 1)): unknown parameter :acount (known: :feed, :partition, :topic, :epoch, :position, :sequence, :attempt, :key, :value, :headers, :account, :amount)"},
		{"ErrUnknownParameterInEmit", func(c *sqlproc.Config) { c.Emit = "SELECT :x AS key, 'v' AS value" },
			"sqlproc p: emit (SELECT :x AS key, 'v' AS value): unknown parameter :x (known: :feed, :partition, :topic, :epoch, :position, :sequence, :attempt, :key, :value, :headers, :account, :amount)"},
		{"ErrSetupParameter", func(c *sqlproc.Config) { c.Setup = "CREATE TABLE t (x); INSERT INTO t VALUES (:feed)" },
			"sqlproc p: setup statement 2 (INSERT INTO t VALUES (:feed)): parameter :feed: setup statements take no parameters"},
		{"ErrPositional", func(c *sqlproc.Config) { c.Apply = "SELECT 1; INSERT INTO t VALUES (?, 1)" },
			"sqlproc p: apply statement 2 (INSERT INTO t VALUES (?, 1)): positional parameter ?: name parameters (:name)"},
		{"ErrRollback", func(c *sqlproc.Config) { c.Apply = "INSERT OR ROLLBACK INTO t VALUES (:account, 1)" },
			"sqlproc p: apply (INSERT OR ROLLBACK INTO t VALUES (:account, 1)): ROLLBACK: a conflict resolution or RAISE that rolls back would end outboxd's transaction, not the statement's; use ABORT"},
		{"ErrRollbackInSetup", func(c *sqlproc.Config) { c.Setup = "CREATE TABLE u (x NOT NULL ON CONFLICT ROLLBACK)" },
			"sqlproc p: setup (CREATE TABLE u (x NOT NULL ON CONFLICT ROLLBACK)): ROLLBACK: a conflict resolution or RAISE that rolls back would end outboxd's transaction, not the statement's; use ABORT"},
		{"ErrTwoRejects", func(c *sqlproc.Config) { c.Reject = "SELECT 'a'; SELECT 'b'" }, "sqlproc p: reject: 2 statements, want one (its rows are the reasons)"},
		{"ErrTwoEmits", func(c *sqlproc.Config) { c.Emit = "SELECT 1; SELECT 2" }, "sqlproc p: emit: 2 statements, want one (its rows are the outputs)"},
		{"ErrNothing", func(c *sqlproc.Config) { c.Apply, c.Emit = " -- nothing\n", "" }, "sqlproc p: neither apply nor emit holds a statement: the processor would do nothing"},
		{"ErrUnterminated", func(c *sqlproc.Config) { c.Apply = "INSERT INTO t VALUES ('x" }, "sqlproc p: apply: at byte 22: unterminated '...'"},
		{"ErrTooLong", func(c *sqlproc.Config) { c.Setup = strings.Repeat(" ", 1<<20+1) }, "sqlproc p: setup: 1048577 bytes of SQL, more than 1048576"},
		{"ErrLongStatementNamedShort", func(c *sqlproc.Config) {
			c.Apply = "INSERT INTO t (account, n)\n   VALUES (:account, :amount), (:account, :nope)"
		}, "sqlproc p: apply (INSERT INTO t (account, n) VALUES (:account, :am ...): unknown parameter :nope (known: :feed, :partition, :topic, :epoch, :position, :sequence, :attempt, :key, :value, :headers, :account, :amount)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := csvConfig()
			c.change(&cfg)
			err := cfg.Validate()
			if err == nil || err.Error() != c.err {
				t.Fatalf("Validate() = %v\nwant %s", err, c.err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("Validate() error has more than one line: %q", err)
			}
		})
	}
}
