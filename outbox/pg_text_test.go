package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// TestPostgres_NotText: bytes PostgreSQL's text refuses (not UTF-8, a NUL)
// never fail a batch. In a message the store keeps (a dead letter's
// error, a feed's last error) they are replaced; in an output's topic
// they refuse the output with a constraint class, the item's; in a
// processor's own text column PostgreSQL's data exception is a constraint
// too, undone with the item's savepoint alone.
func TestPostgres_NotText(t *testing.T) {
	ctx := context.Background()
	s := pgStore(t, pgtest.New(t).DSN)
	testutil.Must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))

	t.Run("DeadLetterMessage", func(t *testing.T) {
		id := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Reason: "bad\xffreason",
			Error: "line \"a\x00b\xfe\"", Payload: []byte("a\x00b\xfe")})
		got, err := s.DeadLetterByID(ctx, "f", id)
		testutil.Must(t, err)
		testutil.Equal(t, "reason", got.Reason, "bad\uFFFDreason")
		testutil.Equal(t, "error", got.Error, `line "a\x00b`+"\uFFFD\"")
		testutil.Equal(t, "payload", string(got.Payload), "a\x00b\xfe") // bytes, as they came
	})

	t.Run("LastError", func(t *testing.T) {
		testutil.Must(t, s.SetLastError(ctx, "f", "stalled on \xff\x00"))
		var got string
		testutil.Must(t, s.View(ctx, func(r *outbox.ReadTx) error {
			return r.Get(ctx, &got, `SELECT last_error FROM feeds WHERE name = 'f'`)
		}))
		testutil.Equal(t, "last error", got, "stalled on \uFFFD\\x00")
	})

	t.Run("Topic", func(t *testing.T) {
		tx := begin(t, s)
		defer tx.Rollback()
		testutil.Must(t, tx.BeginItem(place("f", 1)))
		for _, topic := range []string{"t\xff", "t\x00"} {
			err := tx.Emit(ctx, out(topic, "k", "v"))
			if !errors.Is(err, outbox.ErrNotText) || outbox.Classify(err) != outbox.ClassConstraint {
				t.Fatalf("Emit to topic %q = %v (%v), want ErrNotText, a constraint", topic, err, outbox.Classify(err))
			}
		}
		testutil.Equal(t, "outputs emitted", tx.Emitted(), 0)
	})

	t.Run("StateColumn", func(t *testing.T) {
		tx := begin(t, s)
		defer tx.Rollback()
		_, err := tx.Exec(ctx, `CREATE TABLE accounts (name TEXT PRIMARY KEY)`)
		testutil.Must(t, err)
		testutil.Must(t, tx.BeginItem(place("f", 2)))
		_, err = tx.Exec(ctx, `INSERT INTO accounts VALUES (?)`, "kept")
		testutil.Must(t, err)
		testutil.Must(t, tx.EndItem())
		for i, name := range []string{"a\xffb", "a\x00b"} {
			testutil.Must(t, tx.BeginItem(place("f", int64(3+i))))
			_, err = tx.Exec(ctx, `INSERT INTO accounts VALUES (?)`, name)
			if outbox.Classify(err) != outbox.ClassConstraint || errors.Is(err, outbox.ErrTxLost) {
				t.Fatalf("insert of %q = %v (%v), want a constraint, the transaction standing", name, err, outbox.Classify(err))
			}
			testutil.Must(t, tx.RollbackItem())
		}
		testutil.Must(t, tx.Commit())
		var names []string
		testutil.Must(t, s.View(ctx, func(r *outbox.ReadTx) error {
			return r.Select(ctx, &names, `SELECT name FROM accounts`)
		}))
		if len(names) != 1 || names[0] != "kept" {
			t.Fatalf("accounts = %q, want [kept]", names)
		}
	})
}
