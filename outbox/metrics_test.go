package outbox_test

import (
	"context"
	"os"
	"testing"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func TestStore_WALAndCheckpoint(t *testing.T) {
	outboxtest.SQLiteOnly(t, "SQLite's WAL and its checkpoints")
	ctx := context.Background()
	path := t.TempDir() + "/o.db"
	s, err := outbox.Open(ctx, outbox.DefaultConfig(path))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := s.WALBytes()
	fi, serr := os.Stat(path + "-wal")
	if err != nil || serr != nil || n != fi.Size() || n == 0 {
		t.Fatalf("WALBytes = %d (%v), the file has %v (%v)", n, err, fi, serr)
	}
	if _, err := outbox.WriterOf(s).ExecContext(ctx, `CREATE TABLE t (x BLOB); INSERT INTO t VALUES (zeroblob(100000))`); err != nil {
		t.Fatal(err)
	}
	r, err := s.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.LogFrames == 0 || r.Checkpointed != r.LogFrames || r.Busy || r.Duration <= 0 {
		t.Fatalf("checkpoint %+v: want every frame of a non-empty log copied", r)
	}
}

func TestStore_DeadLetterReasons(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	got, err := s.DeadLetterReasons(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("a new database: %v (%v)", got, err)
	}
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "a"}))
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "b"}))
	for i, r := range []struct{ feed, reason string }{
		{"a", "malformed"}, {"b", "malformed"}, {"a", "malformed"}, {"a", "constraint"}, {"a", "malformed"},
	} {
		deadLetter(t, s, outbox.DeadLetter{Feed: r.feed, Epoch: "e", Position: int64(i), Reason: r.reason, At: 1})
	}
	tx := begin(t, s)
	if ok, err := tx.MarkRequeued(ctx, "a", 1); err != nil || !ok {
		t.Fatalf("requeue: %v %v", ok, err)
	}
	must(t, tx.Commit())
	got, err = s.DeadLetterReasons(ctx)
	must(t, err)
	want := []outbox.ReasonCount{{"a", "constraint", 1}, {"a", "malformed", 3}, {"b", "malformed", 1}}
	if len(got) != len(want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("counts %v, want %v (a requeued dead letter still counts)", got, want)
		}
	}
	if outboxtest.OnPostgres() {
		return // the plan below is SQLite's EXPLAIN QUERY PLAN
	}
	var id, parent, unused int
	var plan string
	must(t, outbox.ReadPoolOf(s).QueryRowContext(ctx, `EXPLAIN QUERY PLAN
		SELECT feed, reason, COUNT(*) FROM dead_letters GROUP BY feed, reason`).Scan(&id, &parent, &unused, &plan))
	if plan != "SCAN dead_letters USING COVERING INDEX dead_letters_reason" {
		t.Fatalf("plan %q: the count must read the index only", plan)
	}
}
