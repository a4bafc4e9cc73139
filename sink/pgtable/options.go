package pgtable

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

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

var options = []string{OptTable, OptMode, OptValue, OptCreate, OptProgressTable, OptRefusedTable, OptMaxConns}

// ConfigFrom makes the configuration of sink name from its DSN (the
// sink's URL), the tables of its topics (topic -> table; an empty table
// is the default one) and its options; an unknown option or a bad value
// is an error naming it.
func ConfigFrom(name, dsn string, tables map[string]string, opts map[string]string) (Config, error) {
	c := Config{DSN: dsn, Sink: name, Create: true}
	for topic, tb := range tables {
		if tb == "" {
			continue
		}
		if c.Tables == nil {
			c.Tables = map[string]string{}
		}
		c.Tables[topic] = tb
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := opts[k]
		switch k {
		case OptTable:
			c.Table = v
		case OptMode:
			c.Mode = Mode(v)
		case OptValue:
			c.Value = ValueType(v)
		case OptCreate:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return Config{}, fmt.Errorf("option %s: %q: want true or false", k, v)
			}
			c.Create = b
		case OptProgressTable:
			c.ProgressTable = v
		case OptRefusedTable:
			c.RefusedTable = v
		case OptMaxConns:
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 100 {
				return Config{}, fmt.Errorf("option %s: %q: want a number from 1 to 100", k, v)
			}
			c.MaxConns = int32(n)
		default:
			return Config{}, fmt.Errorf("option %q: a PostgreSQL sink reads %s", k, strings.Join(options, ", "))
		}
	}
	if err := c.Check(); err != nil {
		return Config{}, err
	}
	return c, nil
}
