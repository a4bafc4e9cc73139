package outbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestDSN shows a connection opened with outbox.DSN has the writer's
// settings, the same the store's own writer reports.
func TestDSN(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the DSN of a SQLite file")
	ctx := context.Background()
	cfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "a?b#c%d.db"))
	cfg.Synchronous = outbox.SyncNormal
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db, err := sql.Open("sqlite", outbox.DSN(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	want := map[string]int64{
		"cache_size":   -outbox.WriterCacheKiB,
		"temp_store":   2, // memory
		"synchronous":  1, // normal
		"foreign_keys": 1,
		"busy_timeout": 5000,
	}
	for pragma, v := range want {
		var got, store int64
		if err := db.QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := outbox.WriterOf(s).QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&store); err != nil {
			t.Fatal(err)
		}
		if got != v || store != v {
			t.Errorf("PRAGMA %s: DSN connection %d, store writer %d, want %d", pragma, got, store, v)
		}
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM feeds").Scan(&n); err != nil {
		t.Errorf("the DSN does not open the store's file: %v", err)
	}
}
