package outbox_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

func TestTx_Hooks(t *testing.T) {
	ctx := context.Background()
	p := outbox.Place{Feed: "f", Epoch: "e", Position: 1}

	t.Run("OnRollbackItemRunsOnRollbackOnly", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		var got []string
		must(t, tx.BeginItem(p))
		tx.OnRollbackItem(func() { got = append(got, "kept item") })
		must(t, tx.EndItem())
		must(t, tx.BeginItem(p))
		tx.OnRollbackItem(func() { got = append(got, "first") })
		tx.OnRollbackItem(func() { got = append(got, "second") })
		must(t, tx.RollbackItem())
		tx.OnRollbackItem(func() { got = append(got, "outside an item") })
		must(t, tx.Commit())
		if want := []string{"second", "first"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("undo ran %v, want %v", got, want)
		}
	})

	t.Run("BeforeCommitWritesInTheTransaction", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		tx.BeforeCommit(func(ctx context.Context) error {
			_, err := tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES ('k', 'v')`)
			return err
		})
		must(t, tx.Commit())
		var v string
		must(t, outbox.ReadPoolOf(s).Get(&v, `SELECT value FROM meta WHERE key = 'k'`))
		equal(t, "value", v, "v")
	})

	t.Run("BeforeCommitErrorFailsTheCommit", func(t *testing.T) {
		s, _ := openStore(t)
		tx := begin(t, s)
		must(t, tx.Emit(ctx, outbox.Output{Topic: "t", Value: []byte("v")}))
		boom := errors.New("boom")
		tx.BeforeCommit(func(context.Context) error { return boom })
		if err := tx.Commit(); !errors.Is(err, boom) {
			t.Fatalf("Commit = %v, want boom", err)
		}
		rows, err := s.Rows(ctx, 0, 10)
		must(t, err)
		equal(t, "rows", len(rows), 0)
	})
}
