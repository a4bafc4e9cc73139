package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// pgStore opens a store on a PostgreSQL database of the test's own.
func pgStore(t *testing.T, dsn string) *outbox.Store {
	t.Helper()
	return outboxtest.OpenStore(t, outbox.DefaultConfig(dsn))
}

func TestPostgres_OpenMigrates(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	// Servers opening one new database at once apply each migration once.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := outbox.Open(ctx, outbox.DefaultConfig(db.DSN))
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
	}
	s := pgStore(t, db.DSN)
	if !s.Postgres() {
		t.Fatal("Postgres() = false for a postgres:// store")
	}
	var version []int
	testutil.Must(t, s.View(ctx, func(r *outbox.ReadTx) error {
		return r.Select(ctx, &version, `SELECT version FROM outboxd_schema`)
	}))
	if len(version) != 1 || version[0] != len(outboxd.PGMigrations()) {
		t.Fatalf("outboxd_schema = %v, want one row %d", version, len(outboxd.PGMigrations()))
	}
	if got, want := len(outboxd.PGMigrations()), len(outboxd.Migrations()); got != want {
		t.Fatalf("%d PostgreSQL migrations, %d SQLite ones", got, want)
	}
}

// TestPostgres_IDsInCommitOrder: a second writer on the database (no
// claim fences it) that commits while the first holds ids waits for the
// first's commit and takes the ids after its: ids follow commit order.
func TestPostgres_IDsInCommitOrder(t *testing.T) {
	db := pgtest.New(t)
	a, b := pgStore(t, db.DSN), pgStore(t, db.DSN)
	ctx := context.Background()
	release := make(chan struct{})
	holding := make(chan struct{})
	a.SetCommitHook(func(context.Context) error {
		close(holding) // a's ids are assigned, its commit not made
		<-release
		return nil
	})
	aDone := make(chan error, 1)
	go func() {
		tx, err := a.Begin(ctx)
		if err == nil {
			testutil.Must(t, tx.BeginItem(place("f", 1)))
			for range 3 {
				testutil.Must(t, tx.Emit(ctx, out("t", "a", "a")))
			}
			testutil.Must(t, tx.EndItem())
			err = tx.Commit()
		}
		aDone <- err
	}()
	<-holding
	bDone := make(chan error, 1)
	go func() {
		tx, err := b.Begin(ctx)
		if err == nil {
			testutil.Must(t, tx.BeginItem(place("f", 2)))
			testutil.Must(t, tx.Emit(ctx, out("t", "b", "b")))
			testutil.Must(t, tx.EndItem())
			err = tx.Commit()
		}
		bDone <- err
	}()
	// b's commit waits for a's lock on outbox_ids: nothing is committed
	// while a holds it.
	watch := db.Conn(t)
	testutil.Wait(t, 30*time.Second, func() error {
		var waiting int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted`).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			return errors.New("b does not wait for a lock yet")
		}
		return nil
	})
	if last, err := b.LastOutboxID(ctx); err != nil || last != 0 {
		t.Fatalf("LastOutboxID while a holds its ids = %d, %v; want 0", last, err)
	}
	close(release)
	testutil.Must(t, <-aDone)
	testutil.Must(t, <-bDone)
	rows, err := b.Rows(ctx, 0, 10)
	testutil.Must(t, err)
	want := []string{"a", "a", "a", "b"}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for i, r := range rows {
		if r.ID != int64(i+1) || string(r.Key) != want[i] {
			t.Errorf("row %d = id %d key %q, want id %d key %q", i, r.ID, r.Key, i+1, want[i])
		}
	}
}

// TestPostgres_Fenced: once a second store claims the database, the
// first's next commit fails with ErrFenced and changes nothing.
func TestPostgres_Fenced(t *testing.T) {
	db := pgtest.New(t)
	a, b := pgStore(t, db.DSN), pgStore(t, db.DSN)
	ctx := context.Background()
	ga, err := a.Claim(ctx)
	testutil.Must(t, err)
	emit(t, a, place("f", 1), out("t", "k", "1"))
	gb, err := b.Claim(ctx)
	testutil.Must(t, err)
	if gb != ga+1 {
		t.Fatalf("claims %d then %d, want consecutive", ga, gb)
	}
	if err := a.CheckOwner(ctx); !errors.Is(err, outbox.ErrFenced) {
		t.Fatalf("CheckOwner of the older store = %v, want ErrFenced", err)
	}
	tx, err := a.Begin(ctx)
	testutil.Must(t, err)
	testutil.Must(t, tx.BeginItem(place("f", 2)))
	testutil.Must(t, tx.Emit(ctx, out("t", "k", "2")))
	testutil.Must(t, tx.EndItem())
	if err := tx.Commit(); !errors.Is(err, outbox.ErrFenced) || outbox.Classify(err) != outbox.ClassFenced {
		t.Fatalf("commit of the older store = %v, want ErrFenced", err)
	}
	emit(t, b, place("f", 2), out("t", "k", "3"))
	rows, err := b.Rows(ctx, 0, 10)
	testutil.Must(t, err)
	if len(rows) != 2 || string(rows[0].Value) != "1" || string(rows[1].Value) != "3" || rows[1].ID != 2 {
		t.Fatalf("rows = %+v, want values 1 and 3 at ids 1 and 2", rows)
	}
}

// TestPostgres_TxLost: on PostgreSQL a failed statement outside an
// item's savepoint aborts the transaction (ErrTxLost); inside one, the
// item is rolled back alone and the batch commits.
func TestPostgres_TxLost(t *testing.T) {
	db := pgtest.New(t)
	s := pgStore(t, db.DSN)
	ctx := context.Background()
	testutil.Must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))

	tx, err := s.Begin(ctx)
	testutil.Must(t, err)
	testutil.Must(t, tx.BeginItem(place("f", 1)))
	testutil.Must(t, tx.Emit(ctx, out("t", "k", "kept")))
	testutil.Must(t, tx.EndItem())
	testutil.Must(t, tx.BeginItem(place("f", 2)))
	testutil.Must(t, tx.Emit(ctx, out("t", "k", "undone")))
	if _, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`); err == nil || errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("a failed statement in an item = %v, want its error, not ErrTxLost", err)
	}
	testutil.Must(t, tx.RollbackItem())
	testutil.Must(t, tx.Commit())
	rows, err := s.Rows(ctx, 0, 10)
	testutil.Must(t, err)
	if len(rows) != 1 || string(rows[0].Value) != "kept" {
		t.Fatalf("rows = %+v, want the kept item's only", rows)
	}

	tx, err = s.Begin(ctx)
	testutil.Must(t, err)
	defer tx.Rollback()
	if _, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`); !errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("a failed statement outside an item = %v, want ErrTxLost", err)
	}
	if err := tx.Commit(); !errors.Is(err, outbox.ErrTxLost) {
		t.Fatalf("commit of a lost transaction = %v, want ErrTxLost", err)
	}
}

func TestIsPostgres(t *testing.T) {
	for db, want := range map[string]bool{
		"postgres://u@h/d": true, "POSTGRESQL://h/d": true, "outboxd.db": false,
		"/var/lib/outboxd/postgres.db": false, "file:x.db": false,
	} {
		if got := outbox.IsPostgres(db); got != want {
			t.Errorf("IsPostgres(%q) = %v, want %v", db, got, want)
		}
	}
}

// TestPostgres_OutboxView: the view outbox shows every output as Rows
// reads it: ids, places, nil and empty keys and values, headers, long
// values (never compressed on PostgreSQL), chunks of many outputs.
func TestPostgres_OutboxView(t *testing.T) {
	s := pgStore(t, pgtest.New(t).DSN)
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	testutil.Must(t, err)
	long := strings.Repeat("compressible ", 200)
	for i := range 150 {
		tx.SetPlace(outbox.Place{Feed: "f", Partition: int32(i % 2), Epoch: "e", Position: int64(i) << 33})
		o := outbox.Output{Topic: "t", Key: []byte(fmt.Sprint(i)), Value: []byte(long + fmt.Sprint(i))}
		switch i % 5 {
		case 1:
			o.Key, o.Value = nil, nil
		case 2:
			o.Key, o.Value = []byte{}, []byte{}
		case 3:
			o.Headers = []outbox.Header{{Key: "h", Value: []byte{0, 0xff}}}
		}
		testutil.Must(t, tx.Emit(ctx, o))
		testutil.Must(t, tx.Emit(ctx, out("u", "k", "second")))
	}
	testutil.Must(t, tx.Commit())
	want, err := s.Rows(ctx, 0, 1000)
	testutil.Must(t, err)
	var got []struct {
		outbox.Row
		KeyNull   bool `db:"key_null"`
		ValueNull bool `db:"value_null"`
	}
	testutil.Must(t, s.View(ctx, func(r *outbox.ReadTx) error {
		return r.Select(ctx, &got, `SELECT id, feed, partition, epoch, position, n, topic, key, value, headers, created_at,
key IS NULL AS key_null, value IS NULL AS value_null FROM outbox ORDER BY id`)
	}))
	if len(got) != 300 || len(want) != 300 {
		t.Fatalf("%d rows in the view, %d read, want 300", len(got), len(want))
	}
	for i, g := range got {
		r := g.Row
		if !g.KeyNull && r.Key == nil {
			r.Key = []byte{}
		}
		if !g.ValueNull && r.Value == nil {
			r.Value = []byte{}
		}
		if !reflect.DeepEqual(r, want[i]) {
			t.Fatalf("view row %d:\n got %+v\nwant %+v", i, r, want[i])
		}
	}
}

// TestPostgres_RelayRowsWindow: the relay's read on PostgreSQL is bounded
// to the chunks of the next ids asked for, from the first chunk there is:
// a range of ids the outbox no longer holds is skipped, not taken for
// the end.
func TestPostgres_RelayRowsWindow(t *testing.T) {
	s := pgStore(t, pgtest.New(t).DSN)
	ctx := context.Background()
	for tx := range 3 {
		outs := make([]outbox.Output, 10)
		for i := range outs {
			outs[i] = out("t", "k", fmt.Sprint(tx*10+i+1))
		}
		emit(t, s, place("f", int64(tx+1)), outs...)
	}
	if _, err := outboxtest.Exec(ctx, s, `DELETE FROM outbox_chunks WHERE last_id <= 10`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		after          int64
		limit          int
		first, last, n int64
	}{{0, 5, 11, 15, 5}, {0, 100, 11, 30, 20}, {12, 100, 13, 30, 18}, {19, 3, 20, 22, 3}, {30, 10, 0, 0, 0}} {
		rows, err := s.RelayRows(ctx, c.after, c.limit)
		testutil.Must(t, err)
		if int64(len(rows)) != c.n || c.n > 0 && (rows[0].ID != c.first || rows[len(rows)-1].ID != c.last) {
			t.Fatalf("RelayRows(%d, %d): %d rows %v, want %d from %d to %d", c.after, c.limit, len(rows), ids(rows), c.n, c.first, c.last)
		}
	}
}
