package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// commitOne commits an empty transaction and returns Commit's error.
func commitOne(t *testing.T, s *outbox.Store) error {
	t.Helper()
	tx, err := s.Begin(context.Background())
	if err != nil {
		return err
	}
	return tx.Commit()
}

// mountTmpfs is testutil.MountTmpfs.
var mountTmpfs = testutil.MountTmpfs

// fill is testutil.FillDisk.
var fill = testutil.FillDisk

func TestStore_CheckWritable(t *testing.T) {
	ctx := context.Background()

	t.Run("Idle", func(t *testing.T) {
		s, _ := openStore(t)
		if err := s.CheckWritable(ctx); err != nil {
			t.Fatalf("CheckWritable of a fresh store = %v", err)
		}
	})

	t.Run("NotBehindABatch", func(t *testing.T) {
		s, _ := openStore(t)
		if err := commitOne(t, s); err != nil {
			t.Fatal(err)
		}
		tx, err := s.Begin(ctx) // holds the one writer connection
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		for range 3 {
			t0 := time.Now()
			if err := s.CheckWritable(ctx); err != nil {
				t.Fatalf("CheckWritable while a transaction holds the writer = %v", err)
			}
			if d := time.Since(t0); d > 500*time.Millisecond {
				t.Fatalf("CheckWritable took %v while a transaction holds the writer", d)
			}
		}
	})

	t.Run("LastWriteFailed", func(t *testing.T) {
		s, _ := openStore(t)
		s.SetCommitHook(func(context.Context) error { return errors.New("injected commit failure") })
		if err := commitOne(t, s); err == nil {
			t.Fatal("commit succeeded through a failing hook")
		}
		err := s.CheckWritable(ctx)
		if err == nil || !strings.Contains(err.Error(), "injected commit failure") {
			t.Fatalf("CheckWritable after a failed commit = %v, want the commit's error", err)
		}
		s.SetCommitHook(nil)
		if err := commitOne(t, s); err != nil {
			t.Fatal(err)
		}
		if err := s.CheckWritable(ctx); err != nil {
			t.Fatalf("CheckWritable after a commit succeeded again = %v", err)
		}
	})

	t.Run("LastErrorDoesNotVouch", func(t *testing.T) {
		// A feed stalled on a full database stores its reason: that
		// one-row update fits in the pages the database has, and must
		// not make the database look writable again.
		outboxtest.SQLiteOnly(t, "a full database is made by PRAGMA max_page_count")
		s, _ := openStore(t)
		must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f", Kind: "file"}))
		var pages int
		must(t, outboxtest.Get(ctx, s, &pages, `PRAGMA page_count`))
		if _, err := outboxtest.Exec(ctx, s, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
			t.Fatal(err)
		}
		tx, err := s.Begin(ctx)
		must(t, err)
		if _, err := tx.Exec(ctx, `CREATE TABLE big AS SELECT zeroblob(1000000) AS b`); outbox.Classify(err) != outbox.ClassFull {
			t.Fatalf("a write past max_page_count = %v, want a full database", err)
		}
		tx.Rollback()
		must(t, s.SetLastError(ctx, "f", "completion failure: disk full"))
		if err := s.CheckWritable(ctx); err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("CheckWritable after a full database and a stored last error = %v, want disk full", err)
		}
	})

	t.Run("ConstraintIsNotTheStores", func(t *testing.T) {
		s, _ := openStore(t)
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tx.Exec(ctx, `INSERT INTO meta VALUES ('k', 'v')`)
		if _, err := tx.Exec(ctx, `INSERT INTO meta VALUES ('k', 'v')`); outbox.Classify(err) != outbox.ClassConstraint {
			t.Fatalf("duplicate key: %v, want a constraint error", err)
		}
		tx.Rollback()
		if err := s.CheckWritable(ctx); err != nil {
			t.Fatalf("CheckWritable after an item's constraint error = %v", err)
		}
	})

	t.Run("IdleImmutable", func(t *testing.T) {
		outboxtest.SQLiteOnly(t, "an unwritable database is made by chattr +i of its file")
		if os.Geteuid() != 0 {
			t.Skip("chattr +i needs root: not root")
		}
		s, _ := openStore(t)
		path := s.Path()
		if out, err := exec.Command("chattr", "+i", path).CombinedOutput(); err != nil {
			t.Skipf("chattr +i not supported here: %v: %s", err, out)
		}
		defer exec.Command("chattr", "-i", path).Run()
		err := s.CheckWritable(ctx)
		if err == nil || !strings.Contains(err.Error(), "not writable") {
			t.Fatalf("CheckWritable of an immutable database = %v, want not writable", err)
		}
	})

	t.Run("IdleDiskFull", func(t *testing.T) {
		dir := mountTmpfs(t, "2m")
		s := openAt(t, outbox.DefaultConfig(filepath.Join(dir, "t.db")))
		filler := fill(t, dir)
		err := s.CheckWritable(ctx)
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("CheckWritable on a full disk = %v, want disk full", err)
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		// The failed check is kept for a second; a commit vouches at once.
		if err := commitOne(t, s); err != nil {
			t.Fatal(err)
		}
		if err := s.CheckWritable(ctx); err != nil {
			t.Fatalf("CheckWritable once the disk has room and a commit succeeded = %v", err)
		}
	})
}
