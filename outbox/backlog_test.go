package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// emitN commits n rows of feed f, one item each, values of size vsize
// (letters in turn: they compress), and returns the bytes the backlog
// counts for them: those of the chunks the commit wrote.
func emitN(t *testing.T, s *outbox.Store, n, vsize int, at int64) (bytes int64) {
	return emitFilled(t, s, n, vsize, at, func(val []byte, _ int) {
		for i := range val {
			val[i] = byte('a' + i%26)
		}
	})
}

// emitFilled is emitN with each value filled by fill(value, i).
func emitFilled(t *testing.T, s *outbox.Store, n, vsize int, at int64, fill func([]byte, int)) (bytes int64) {
	t.Helper()
	ctx := context.Background()
	before, err := s.LastOutboxID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	val := make([]byte, vsize)
	for i := range n {
		fill(val, i)
		p := outbox.Place{Feed: "ledger", Epoch: "65024:9979361:7d453c7ecb0cbfce", Position: at + int64(i) + 1}
		if err := tx.BeginItem(p); err != nil {
			t.Fatal(err)
		}
		key := []byte(fmt.Sprintf("acct-%d", i%1000))
		hs := []outbox.Header{{Key: "h", Value: []byte("v")}}
		if err := tx.Emit(ctx, outbox.Output{Topic: "ledger.out", Key: key, Value: val, Headers: hs}); err != nil {
			t.Fatal(err)
		}
		if err := tx.EndItem(); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := outboxtest.Get(ctx, s, &bytes, `SELECT coalesce(sum(bytes), 0) FROM outbox_chunks WHERE last_id > ?`, before); err != nil {
		t.Fatal(err)
	}
	return bytes
}

func pending(t *testing.T, s *outbox.Store) outbox.Pending {
	t.Helper()
	p, err := s.PendingBacklog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestStore_PendingBacklog(t *testing.T) {
	path := storePath(t, "b.db")
	s := openAt(t, outbox.DefaultConfig(path))
	if p := pending(t, s); p != (outbox.Pending{}) {
		t.Fatalf("empty store: %+v", p)
	}
	b1 := emitN(t, s, 10, 100, 0) // ids 1..10
	b2 := emitN(t, s, 5, 50, 10)  // ids 11..15
	if p := pending(t, s); p != (outbox.Pending{Rows: 15, Bytes: b1 + b2}) {
		t.Fatalf("after two commits: %+v, want 15 rows, %d bytes", p, b1+b2)
	}
	ctx := context.Background()
	t.Run("PublishedPartly", func(t *testing.T) {
		// A commit published in part counts whole: never under the truth.
		if err := s.SetRelayProgress(ctx, "r", 12); err != nil {
			t.Fatal(err)
		}
		if p := pending(t, s); p != (outbox.Pending{Rows: 3, Bytes: b2}) {
			t.Fatalf("published through 12: %+v, want 3 rows, %d bytes", p, b2)
		}
	})
	t.Run("Reopened", func(t *testing.T) {
		// The rows pending at open are counted by a scan, as the commits
		// counted them, a chunk (here 11..15) published in part whole.
		b3 := emitN(t, s, 7, 300, 15) // ids 16..22
		s.Close()
		s2 := openAt(t, outbox.DefaultConfig(path))
		p := pending(t, s2)
		if want := (outbox.Pending{Rows: 10, Bytes: b2 + b3}); p != want {
			t.Fatalf("reopened: %+v, want %+v", p, want)
		}
		b4 := emitN(t, s2, 2, 10, 22)
		if p := pending(t, s2); p.Rows != 12 || p.Bytes != b2+b3+b4 {
			t.Fatalf("reopened, then a commit: %+v", p)
		}
		if err := s2.SetRelayProgress(ctx, "r", 24); err != nil {
			t.Fatal(err)
		}
		if p := pending(t, s2); p != (outbox.Pending{}) {
			t.Fatalf("all published: %+v", p)
		}
	})
}

// Past the meter's bound on marks, commits merge: the total stays exact,
// and a merged pair counts until its last row is published.
func TestStore_PendingBacklogManyCommits(t *testing.T) {
	cfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "m.db"))
	cfg.Synchronous = outbox.SyncNormal // many small commits, quickly
	s := openAt(t, cfg)
	const commits = 6000 // past the meter's bound
	var total int64
	var each []int64
	for i := range commits {
		b := emitN(t, s, 1, 1+i%7, int64(i))
		each = append(each, b)
		total += b
	}
	if p := pending(t, s); p != (outbox.Pending{Rows: commits, Bytes: total}) {
		t.Fatalf("%+v, want %d rows, %d bytes", p, commits, total)
	}
	if err := s.SetRelayProgress(context.Background(), "r", commits/2); err != nil {
		t.Fatal(err)
	}
	var rest int64
	for _, b := range each[commits/2:] {
		rest += b
	}
	p := pending(t, s)
	if p.Rows != commits/2 || p.Bytes < rest || p.Bytes > rest+each[commits/2-1]*4 {
		t.Fatalf("half published: %+v, want %d rows and at least %d bytes (a few rows more at most)", p, commits/2, rest)
	}
}

// A chunk's bytes are about what it takes on disk, compressed or not: a
// database of ledger-like outputs grows by them within a quarter either
// way, up to half more for incompressible rows of a kilobyte (a chunk
// holds three of them, and the rest of its page is slack).
func TestStore_BacklogBytesOnDisk(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the outbox's bytes on disk are the SQLite file's and its WAL's")
	dir := t.TempDir()
	path := filepath.Join(dir, "d.db")
	s := openAt(t, outbox.DefaultConfig(path))
	size := func() int64 {
		var n int64
		for _, f := range []string{path, path + "-wal"} {
			if fi, err := os.Stat(f); err == nil {
				n += fi.Size()
			}
		}
		return n
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		vsize  int
		random bool
	}{{60, false}, {120, false}, {1000, false}, {60, true}, {120, true}, {1000, true}} {
		vsize := c.vsize
		t.Run(fmt.Sprintf("%d/random=%v", vsize, c.random), func(t *testing.T) {
			if _, err := outbox.WriterOf(s).Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
				t.Fatal(err)
			}
			before := size()
			var counted int64
			for i := range 20 {
				if c.random {
					counted += emitFilled(t, s, 2000, vsize, int64(i*2000), func(v []byte, _ int) {
						for j := range v {
							v[j] = byte(rng.UintN(256))
						}
					})
				} else {
					counted += emitN(t, s, 2000, vsize, int64(i*2000))
				}
			}
			if _, err := outbox.WriterOf(s).Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
				t.Fatal(err)
			}
			grew := size() - before
			ratio := float64(grew) / float64(counted)
			t.Logf("values of %d bytes (random %v): %d rows, counted %d bytes, the file grew %d: %.2f", vsize, c.random, 40_000, counted, grew, ratio)
			if most := map[bool]float64{true: 1.5, false: 1.25}[vsize >= 1000]; ratio < 0.75 || ratio > most {
				t.Fatalf("the file grew %.2f times the counted bytes, want 0.75 to %.2f", ratio, most)
			}
		})
	}
}
