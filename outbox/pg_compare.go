package outbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/jmoiron/sqlx"
)

// The reads of compare.go on PostgreSQL: the catalog is
// information_schema and pg_index rather than sqlite_schema and
// pragma_table_info, and a sort spills to disk by itself (work_mem), so
// the outputs by place need no connection of their own.

// pgSortConn is fileSortConn on PostgreSQL: a connection of the read pool
// as it is.
func (s *Store) pgSortConn(ctx context.Context) (*sqlx.Conn, func() error, error) {
	conn, err := s.rdb.Connx(ctx)
	if err != nil {
		return nil, nil, err
	}
	return conn, conn.Close, nil
}

// pgOwnTables are the tables outboxd keeps on PostgreSQL beside OwnTables.
var pgOwnTables = []string{"outboxd_schema"}

// pgStateTableNames lists the tables of the store's schema that are no
// one's but the processors'.
func (s *Store) pgStateTableNames(ctx context.Context) ([]string, error) {
	var names []string
	if err := s.rdb.SelectContext(ctx, &names, `SELECT table_name FROM information_schema.tables
WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name COLLATE "C"`); err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	return slices.DeleteFunc(names, func(n string) bool { return slices.Contains(pgOwnTables, n) }), nil
}

// pgStateTable is stateTable on PostgreSQL: the columns in their order,
// the primary key's in key order.
func (s *Store) pgStateTable(ctx context.Context, name string) (StateTable, error) {
	var cols []struct {
		Name  string `db:"name"`
		Text  bool   `db:"text"`
		KeyAt *int   `db:"key_at"`
	}
	if err := s.rdb.SelectContext(ctx, &cols, `SELECT a.attname AS name,
a.atttypid IN ('text'::regtype, 'varchar'::regtype, 'bpchar'::regtype) AS text,
array_position(i.indkey::int2[], a.attnum) AS key_at
FROM pg_attribute AS a
LEFT JOIN pg_index AS i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = (quote_ident(current_schema()) || '.' || quote_ident(?))::regclass
AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, name); err != nil {
		return StateTable{}, fmt.Errorf("read the columns of %s: %w", name, err)
	}
	t := StateTable{Name: name}
	key := map[int]string{}
	for _, c := range cols {
		t.Columns = append(t.Columns, c.Name)
		if c.KeyAt != nil {
			key[*c.KeyAt] = c.Name
		}
		if c.Name == "feed" {
			t.FeedColumn = true
		}
	}
	for i := 1; i <= len(key); i++ {
		t.Key = append(t.Key, key[i])
	}
	if len(t.Key) == 0 {
		t.Key = t.Columns
	}
	return t, nil
}
