package pgtable

import "github.com/outboxd/outboxd/sink"

// Option names a sink's configuration may set (options: in the sinks:
// section), each documented in docs/sinks.md.
const (
	OptTable         = "table"          // the table of topics without their own (default outboxd_outputs)
	OptMode          = "mode"           // insert (default) or upsert
	OptValue         = "value"          // jsonb (default), bytea or auto
	OptCreate        = "create"         // true (default): create missing tables; false: check them
	OptProgressTable = "progress_table" // default outboxd_sink_progress
	OptRefusedTable  = "refused_table"  // default outboxd_sink_refused
	OptMaxConns      = "max_conns"      // connections to the database (default 2)
)

// target names a PostgreSQL sink in errors.
const target = "a PostgreSQL sink"

// ConfigFrom makes the configuration of sink name from its DSN (the
// sink's URL), the tables of its topics (topic -> table; an empty table
// is the default one) and its options; an unknown option or a bad value
// is an error naming it.
func ConfigFrom(name, dsn string, tables map[string]string, opts map[string]string) (Config, error) {
	c := Config{DSN: dsn, Sink: name, Create: true}
	c.Tables = sink.Named(tables)
	if err := sink.SetOptions(target, opts, []sink.Option{
		{Name: OptTable, Set: sink.Text(&c.Table)},
		{Name: OptMode, Set: sink.Text(&c.Mode)},
		{Name: OptValue, Set: sink.Text(&c.Value)},
		{Name: OptCreate, Set: sink.Bool(&c.Create)},
		{Name: OptProgressTable, Set: sink.Text(&c.ProgressTable)},
		{Name: OptRefusedTable, Set: sink.Text(&c.RefusedTable)},
		{Name: OptMaxConns, Set: sink.Count(&c.MaxConns, 1, 100)},
	}); err != nil {
		return Config{}, err
	}
	if err := c.Check(); err != nil {
		return Config{}, err
	}
	return c, nil
}
