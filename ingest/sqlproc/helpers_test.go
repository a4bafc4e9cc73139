package sqlproc_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// loadConfig reads a processor's configuration as the configuration file
// holds it, refusing unknown keys.
func loadConfig(tb testing.TB, name, path string) sqlproc.Config {
	tb.Helper()
	c, err := readConfig(name, path)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func readConfig(name, path string) (sqlproc.Config, error) {
	var c sqlproc.Config
	src, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	c.Name = name
	return c, nil
}

// openStore opens a store in a new file, with the SQL guard unless
// unguarded.
func openStore(tb testing.TB, cfg func(*outbox.Config), unguarded ...bool) *outbox.Store {
	tb.Helper()
	s := outboxtest.NewStore(tb, cfg)
	if len(unguarded) == 0 || !unguarded[0] {
		if err := sqlproc.Guard(context.Background(), s); err != nil {
			tb.Fatal(err)
		}
	}
	return s
}

func newProc(tb testing.TB, cfg sqlproc.Config) *sqlproc.Processor {
	tb.Helper()
	p, err := sqlproc.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// inTx runs f in a transaction of s and commits it.
func inTx(tb testing.TB, s *outbox.Store, f func(tx *outbox.Tx) error) error {
	tb.Helper()
	tx, err := s.Begin(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
	return nil
}

func setup(tb testing.TB, s *outbox.Store, p *sqlproc.Processor) {
	tb.Helper()
	if err := inTx(tb, s, func(tx *outbox.Tx) error { return p.Setup(context.Background(), tx) }); err != nil {
		tb.Fatal(err)
	}
}

// applyItem applies one item in its own transaction, as the loop does: in
// the item's savepoint, rolled back alone if Apply fails. The transaction
// commits either way; Apply's error is returned.
func applyItem(tb testing.TB, s *outbox.Store, p ingest.Processor, d ingest.Delivery, item ingest.Item) error {
	tb.Helper()
	return applyItemCtx(tb, context.Background(), s, p, d, item)
}

// applyItemCtx is applyItem with the attempt's context.
func applyItemCtx(tb testing.TB, ctx context.Context, s *outbox.Store, p ingest.Processor, d ingest.Delivery, item ingest.Item) error {
	tb.Helper()
	var applyErr error
	err := inTx(tb, s, func(tx *outbox.Tx) error {
		if err := tx.BeginItem(d.Place()); err != nil {
			return err
		}
		if applyErr = p.Apply(ctx, tx, d, item); applyErr != nil {
			return tx.RollbackItem()
		}
		return tx.EndItem()
	})
	if err != nil {
		tb.Fatal(err)
	}
	return applyErr
}

// at is the delivery of a file line ending at pos.
func at(pos int64) ingest.Delivery {
	return ingest.Delivery{Feed: "f", Epoch: "e1", Position: pos, Sequence: pos, Attempt: 1}
}

func line(s string) ingest.Item { return ingest.Item{Value: []byte(s)} }

// rows returns every output row of s, in id order.
func rows(tb testing.TB, s *outbox.Store) []outbox.Row {
	tb.Helper()
	rs, err := s.Rows(context.Background(), 0, 1<<20)
	if err != nil {
		tb.Fatal(err)
	}
	return rs
}

// wait is testutil.Wait.
var wait = testutil.Wait
