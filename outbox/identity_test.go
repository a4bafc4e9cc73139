package outbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// emitOne commits one output row through s and returns Commit's error.
func emitOne(t *testing.T, s *outbox.Store) error {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tx.Emit(ctx, outbox.Output{Topic: "t", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	return tx.Commit()
}

func TestStore_CheckPath(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the identity of the database file")
	ctx := context.Background()
	setup := func(t *testing.T) (string, *outbox.Store) {
		path := filepath.Join(t.TempDir(), "t.db")
		return path, openAt(t, outbox.DefaultConfig(path))
	}
	moved := func(t *testing.T, s *outbox.Store, how string) {
		t.Helper()
		err := s.CheckPath()
		if !errors.Is(err, outbox.ErrMoved) || !errors.Is(err, outbox.ErrFenced) || !strings.Contains(err.Error(), how) {
			t.Fatalf("CheckPath = %v, want ErrMoved (and ErrFenced) saying %q", err, how)
		}
		if err := emitOne(t, s); !errors.Is(err, outbox.ErrMoved) {
			t.Fatalf("Commit = %v, want ErrMoved: nothing may be committed to a file no one will open again", err)
		}
	}

	t.Run("OK", func(t *testing.T) {
		_, s := setup(t)
		if err := s.CheckPath(); err != nil {
			t.Fatal(err)
		}
		if err := emitOne(t, s); err != nil {
			t.Fatal(err)
		}
		// Another process opening and closing the database leaves its
		// files alone: this store still holds them open.
		other, err := outbox.Open(ctx, outbox.DefaultConfig(s.Path()))
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.CheckPath(); err != nil {
			t.Fatalf("after another store came and went: %v", err)
		}
	})

	t.Run("ErrDeleted", func(t *testing.T) {
		path, s := setup(t)
		for _, suf := range []string{"", "-wal", "-shm"} {
			if err := os.Remove(path + suf); err != nil {
				t.Fatal(err)
			}
		}
		moved(t, s, path+" was deleted")
	})

	t.Run("ErrDeletedFileOnly", func(t *testing.T) {
		path, s := setup(t)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		moved(t, s, path+" was deleted")
	})

	t.Run("ErrWALDeleted", func(t *testing.T) {
		path, s := setup(t)
		if err := os.Remove(path + "-wal"); err != nil {
			t.Fatal(err)
		}
		moved(t, s, path+"-wal was deleted")
	})

	t.Run("ErrReplaced", func(t *testing.T) {
		path, s := setup(t)
		other := filepath.Join(filepath.Dir(path), "other.db")
		o := openAt(t, outbox.DefaultConfig(other))
		o.Close()
		if err := os.Rename(other, path); err != nil {
			t.Fatal(err)
		}
		moved(t, s, path+" was replaced by another file")
	})
}

func TestStore_CheckOwner(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the identity of the database file")
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "t.db")
	older, newer := openAt(t, outbox.DefaultConfig(path)), openAt(t, outbox.DefaultConfig(path))
	if older.Claimed() || older.CheckOwner(ctx) != nil {
		t.Fatalf("an unclaimed store: Claimed %v, CheckOwner %v; want false, nil", older.Claimed(), older.CheckOwner(ctx))
	}
	if _, err := older.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	if !older.Claimed() || older.CheckOwner(ctx) != nil {
		t.Fatalf("the owner: Claimed %v, CheckOwner %v; want true, nil", older.Claimed(), older.CheckOwner(ctx))
	}
	if _, err := newer.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	if err := older.CheckOwner(ctx); !errors.Is(err, outbox.ErrFenced) || !strings.Contains(err.Error(), "generation 2, this process has 1") {
		t.Fatalf("CheckOwner of the older store = %v, want ErrFenced naming both generations", err)
	}
	if err := newer.CheckOwner(ctx); err != nil {
		t.Fatalf("CheckOwner of the newer store = %v", err)
	}
}

func TestStore_AcceptAsNew(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	if _, ok, err := s.AcceptedAsNew(ctx); ok || err != nil {
		t.Fatalf("AcceptedAsNew of a fresh database = %v, %v; want false, nil", ok, err)
	}
	first := clk.Now()
	if at, err := s.AcceptAsNew(ctx); err != nil || !at.Equal(first) {
		t.Fatalf("AcceptAsNew = %v, %v; want %v", at, err, first)
	}
	clk.Add(time.Hour)
	if at, err := s.AcceptAsNew(ctx); err != nil || !at.Equal(first) {
		t.Fatalf("AcceptAsNew again = %v, %v; want the first time %v", at, err, first)
	}
	if at, ok, err := s.AcceptedAsNew(ctx); !ok || err != nil || !at.Equal(first) {
		t.Fatalf("AcceptedAsNew = %v, %v, %v; want %v", at, ok, err, first)
	}
}

// TestStore_CloseAfterMove takes the database file away from an open store
// that wrote to it, closes the store, and opens the path again: the new
// store must see the file at the path, not the old database's write-ahead
// log replayed onto it; and the old store's SaveCopy must hold everything
// it committed.
func TestStore_CloseAfterMove(t *testing.T) {
	outboxtest.SQLiteOnly(t, "a database file moved away")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		take func(t *testing.T, path string)
	}{
		{"Replaced", func(t *testing.T, path string) {
			other := path + ".other"
			o, err := outbox.Open(ctx, outbox.DefaultConfig(other))
			if err != nil {
				t.Fatal(err)
			}
			o.Close()
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"FileDeleted", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "t.db")
			old, err := outbox.Open(ctx, outbox.DefaultConfig(path))
			if err != nil {
				t.Fatal(err)
			}
			id, err := old.MetaID(ctx, "relay_id")
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if err := emitOne(t, old); err != nil {
					t.Fatal(err)
				}
			}
			tc.take(t, path)
			rescue := filepath.Join(dir, "rescued.db")
			if err := old.SaveCopy(ctx, rescue); err != nil {
				t.Fatal(err)
			}
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}

			now := openAt(t, outbox.DefaultConfig(path))
			if got, err := now.MetaID(ctx, "relay_id"); err != nil || got == id {
				t.Fatalf("the database at the path has relay id %q (%v): the old database's log was replayed onto it", got, err)
			}
			if n, err := now.LastOutboxID(ctx); err != nil || n != 0 {
				t.Fatalf("the database at the path has outbox ids up to %d (%v), want none", n, err)
			}
			if ok, err := now.IntegrityCheck(ctx); err != nil || ok != "ok" {
				t.Fatalf("integrity_check = %q, %v", ok, err)
			}

			saved := openAt(t, outbox.DefaultConfig(rescue))
			if got, err := saved.MetaID(ctx, "relay_id"); err != nil || got != id {
				t.Fatalf("the copy has relay id %q (%v), want %q", got, err, id)
			}
			if n, err := saved.LastOutboxID(ctx); err != nil || n != 3 {
				t.Fatalf("the copy has outbox ids up to %d (%v), want 3", n, err)
			}
		})
	}
}
