package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

func TestStore_Claim(t *testing.T) {
	ctx := context.Background()
	path := storePath(t, "t.db")
	open := func() *outbox.Store {
		s, err := outbox.Open(ctx, outbox.DefaultConfig(path))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	emit := func(s *outbox.Store) error {
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
	older, newer := open(), open()
	if g, err := older.Claim(ctx); err != nil || g != 1 {
		t.Fatalf("first Claim = %d, %v; want 1", g, err)
	}
	if err := emit(older); err != nil {
		t.Fatalf("commit of the owner: %v", err)
	}
	if g, err := newer.Claim(ctx); err != nil || g != 2 {
		t.Fatalf("second Claim = %d, %v; want 2", g, err)
	}
	if err := emit(older); !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("commit of the older store = %v, want ErrFenced", err)
	}
	if err := emit(newer); err != nil {
		t.Fatalf("commit of the newer store: %v", err)
	}
	rows, err := newer.Rows(ctx, 0, 10)
	if err != nil || len(rows) != 2 {
		t.Fatalf("%d rows (%v), want 2: the fenced commit must leave nothing", len(rows), err)
	}
}

// TestStore_OpenConcurrently opens one new database from several stores at
// once, as a server and a tool starting together do: each migration must be
// applied once, and every Open succeed.
func TestStore_OpenConcurrently(t *testing.T) {
	path := storePath(t, "t.db")
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			s, err := outbox.Open(context.Background(), outbox.DefaultConfig(path))
			if err == nil {
				err = s.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("Open: %v", err)
		}
	}
}
