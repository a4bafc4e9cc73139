package outbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// batch commits one item of feed's partition at pos (one output, value v)
// and the partition's position after it, as the ingest loop does.
func batch(s *outbox.Store, feed string, partition int32, pos int64, v string) error {
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tx.BeginItem(outbox.Place{Feed: feed, Partition: partition, Epoch: "e", Position: pos}); err != nil {
		return err
	}
	if err := tx.Emit(ctx, out("t", "k", v)); err != nil {
		return err
	}
	if err := tx.EndItem(); err != nil {
		return err
	}
	if err := tx.SetPosition(ctx, feed, outbox.Checkpoint{Partition: partition, Epoch: "e", Position: pos + 1}); err != nil {
		return err
	}
	return tx.Commit()
}

// testPartitionOwners runs the owner epochs' contract on two stores of one
// database: a zombie's batch fails with ErrFenced and commits nothing.
func testPartitionOwners(t *testing.T, a, b *outbox.Store) {
	ctx := context.Background()
	for _, s := range []*outbox.Store{a, b} {
		testutil.Must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "g", Kind: "kafka"}))
		testutil.Must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "plain", Kind: "file"}))
	}
	ea, err := a.ClaimPartition(ctx, "g", 0, "a")
	testutil.Must(t, err)
	testutil.Equal(t, "a's epoch", ea, int64(1))
	testutil.Must(t, batch(a, "g", 0, 0, "a0"))

	eb, err := b.ClaimPartition(ctx, "g", 0, "b")
	testutil.Must(t, err)
	testutil.Equal(t, "b's epoch", eb, int64(2))
	// a goes on with the batch it had in hand: fenced, nothing of it stands.
	if err := batch(a, "g", 0, 1, "zombie"); !errors.Is(err, outbox.ErrFenced) || outbox.Classify(err) != outbox.ClassFenced {
		t.Fatalf("the zombie's commit = %v, want ErrFenced", err)
	}
	// A partition a never claimed is refused too.
	if err := batch(a, "g", 1, 0, "unclaimed"); !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("a commit of an unclaimed partition = %v, want ErrFenced", err)
	}
	// Another feed, not a group feed, is not checked.
	testutil.Must(t, batch(a, "plain", 0, 0, "plain"))

	ps, err := b.Positions(ctx, "g")
	testutil.Must(t, err)
	testutil.Equal(t, "position b resumes from", ps[0].Position, int64(1))
	testutil.Must(t, batch(b, "g", 0, 1, "b1"))

	rows, err := b.Rows(ctx, 0, 10)
	testutil.Must(t, err)
	var vs []string
	for _, r := range rows {
		vs = append(vs, string(r.Value))
	}
	testutil.Equal(t, "outputs", len(vs), 3)
	if vs[0] != "a0" || vs[1] != "plain" || vs[2] != "b1" {
		t.Fatalf("outputs = %q, want [a0 plain b1]", vs)
	}
	ps, err = a.Positions(ctx, "g")
	testutil.Must(t, err)
	testutil.Equal(t, "position after b", ps[0].Position, int64(2))

	// a releasing what it no longer holds changes nothing; b's release
	// clears the owner and keeps the epoch.
	testutil.Must(t, a.ReleasePartition(ctx, "g", 0))
	owners, err := a.PartitionOwners(ctx, "g")
	testutil.Must(t, err)
	if len(owners) != 1 || owners[0].Owner != "b" || owners[0].Epoch != 2 {
		t.Fatalf("owners = %+v, want g[0] held by b at epoch 2", owners)
	}
	testutil.Equal(t, "b holds", len(b.HeldPartitions("g")), 1)
	testutil.Must(t, b.ReleasePartition(ctx, "g", 0))
	owners, err = a.PartitionOwners(ctx, "")
	testutil.Must(t, err)
	if len(owners) != 1 || owners[0].Owner != "" || owners[0].Epoch != 2 {
		t.Fatalf("owners = %+v, want g[0] released at epoch 2", owners)
	}
	if err := batch(b, "g", 0, 2, "released"); !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("a commit after the release = %v, want ErrFenced", err)
	}
}

func TestPartitionOwners_SQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.db")
	a := outboxtest.OpenStore(t, outbox.DefaultConfig(path))
	b := outboxtest.OpenStore(t, outbox.DefaultConfig(path))
	testPartitionOwners(t, a, b)
}

func TestPartitionOwners_Postgres(t *testing.T) {
	db := pgtest.New(t)
	testPartitionOwners(t, pgStore(t, db.DSN), pgStore(t, db.DSN))
}

// TestPartitionOwners_PostgresClaimWaitsForCommit: on PostgreSQL a claim
// made while the old owner's commit is in flight (its epoch checked, its
// COMMIT not yet sent) waits for that commit, and the new owner then
// reads the position the commit left: the commit is not lost and not
// applied twice.
func TestPartitionOwners_PostgresClaimWaitsForCommit(t *testing.T) {
	db := pgtest.New(t)
	a, b := pgStore(t, db.DSN), pgStore(t, db.DSN)
	ctx := context.Background()
	testutil.Must(t, a.RegisterFeed(ctx, outbox.FeedInfo{Name: "g", Kind: "kafka"}))
	_, err := a.ClaimPartition(ctx, "g", 0, "a")
	testutil.Must(t, err)

	inCommit, release := make(chan struct{}), make(chan struct{})
	a.SetCommitHook(func(context.Context) error {
		close(inCommit)
		<-release
		return nil
	})
	committed := make(chan error, 1)
	go func() { committed <- batch(a, "g", 0, 0, "a0") }()
	<-inCommit
	claimed := make(chan error, 1)
	go func() {
		_, err := b.ClaimPartition(ctx, "g", 0, "b")
		claimed <- err
	}()
	conn := db.Conn(t)
	testutil.Wait(t, 10*time.Second, func() error {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return errors.New("the claim does not wait on a lock yet")
		}
		return nil
	})
	select {
	case err := <-claimed:
		t.Fatalf("the claim returned (%v) while the old owner's commit was in flight", err)
	default:
	}
	close(release)
	testutil.Must(t, <-committed)
	testutil.Must(t, <-claimed)
	a.SetCommitHook(nil)
	ps, err := b.Positions(ctx, "g")
	testutil.Must(t, err)
	testutil.Equal(t, "position after the claim", ps[0].Position, int64(1))
	if err := batch(a, "g", 0, 1, "zombie"); !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("the old owner's next commit = %v, want ErrFenced", err)
	}
	testutil.Must(t, batch(b, "g", 0, 1, "b1"))
	rows, err := b.Rows(ctx, 0, 10)
	testutil.Must(t, err)
	if len(rows) != 2 || string(rows[0].Value) != "a0" || string(rows[1].Value) != "b1" {
		t.Fatalf("rows = %+v, want a0 then b1", rows)
	}
}

// TestPartitionOwners_PostgresPausedCommit: a server paused in the middle
// of a commit (its epoch read FOR SHARE, its COMMIT not sent) holds the
// next owner's claim back only for IdleInTxTimeout: PostgreSQL ends its
// session, the claim goes through, and the paused commit fails once it
// runs again, leaving nothing.
func TestPartitionOwners_PostgresPausedCommit(t *testing.T) {
	db := pgtest.New(t)
	cfg := outbox.DefaultConfig(db.DSN)
	cfg.IdleInTxTimeout = 500 * time.Millisecond
	a, b := outboxtest.OpenStore(t, cfg), outboxtest.OpenStore(t, cfg)
	ctx := context.Background()
	testutil.Must(t, a.RegisterFeed(ctx, outbox.FeedInfo{Name: "g", Kind: "kafka"}))
	_, err := a.ClaimPartition(ctx, "g", 0, "a")
	testutil.Must(t, err)
	paused, resume := make(chan struct{}), make(chan struct{})
	a.SetCommitHook(func(context.Context) error {
		close(paused)
		<-resume
		return nil
	})
	committed := make(chan error, 1)
	go func() { committed <- batch(a, "g", 0, 0, "paused") }()
	<-paused
	epoch, err := b.ClaimPartition(ctx, "g", 0, "b") // returns once PostgreSQL ended a's session
	testutil.Must(t, err)
	testutil.Equal(t, "b's epoch", epoch, int64(2))
	close(resume)
	if err := <-committed; err == nil {
		t.Fatal("the paused commit succeeded after its session ended")
	}
	rows, err := b.Rows(ctx, 0, 10)
	testutil.Must(t, err)
	testutil.Equal(t, "rows", len(rows), 0)
	ps, err := b.Positions(ctx, "g")
	testutil.Must(t, err)
	testutil.Equal(t, "positions", len(ps), 0)
}
