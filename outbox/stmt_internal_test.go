package outbox

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A statement prepared outside any transaction waits for the writer
// connection; meanwhile the transaction holding it must still reach the
// store's statements, or neither ever goes on.
func TestStore_PrepareWhileTxHoldsWriter(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, DefaultConfig(filepath.Join(t.TempDir(), "t.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()

	prepared := make(chan error, 1)
	go func() {
		_, err := s.prepared(ctx, `SELECT count(*) FROM meta`)
		prepared <- err
	}()
	// Wait until that goroutine waits for the connection.
	for deadline := time.Now().Add(10 * time.Second); !waitingForConn(); {
		if time.Now().After(deadline) {
			t.Fatal("the prepare never waited for the writer connection")
		}
		runtime.Gosched()
	}

	done := make(chan error, 1)
	go func() {
		_, err := tx.Stmt(ctx, `SELECT count(*) FROM feeds`)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the transaction could not get a statement while a prepare waited for its connection")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-prepared; err != nil {
		t.Fatal(err)
	}
}

// waitingForConn reports whether a goroutine in Store.prepared waits for a
// database/sql connection.
func waitingForConn() bool {
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "outbox.(*Store).prepared") && strings.Contains(g, "database/sql.(*DB).conn") {
			return true
		}
	}
	return false
}
