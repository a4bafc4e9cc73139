package outbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
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

// mountTmpfs mounts a tmpfs of size at a new directory, unmounted when the
// test ends; it skips the test when that is not possible here.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full disk needs a small tmpfs, and mounting one needs root: not root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s): a full disk cannot be made", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file in dir until the disk is full, and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", path, err)
			}
			return path
		}
	}
}

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
