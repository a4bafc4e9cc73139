package sqlproc_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Statements of the floor: the SQL ledger's three, as the processor
// prepares them (positional parameters), with the JSON escaping's test
// kept, since it is part of the emit's cost.
const (
	floorReject = `SELECT 'malformed' WHERE typeof(?1) <> 'text' OR ?1 = '' OR typeof(?2) <> 'integer'
  OR typeof(coalesce((SELECT balance FROM balances WHERE account = ?1), 0) + ?2) <> 'integer'`
	floorUpsert = `INSERT INTO balances (account, balance) VALUES (?1, ?2)
  ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance`
	floorEmit = `SELECT ?1 AS key,
  CASE WHEN (?1 || ?3 || ?4) GLOB '*[<>&]*' OR instr(?1 || ?3 || ?4, char(8232)) OR instr(?1 || ?3 || ?4, char(8233))
  THEN replace(json_object('account', ?1, 'amount', ?2, 'balance', balance, 'feed', ?3, 'epoch', ?4, 'position', ?5), '<', '\u003c')
  ELSE json_object('account', ?1, 'amount', ?2, 'balance', balance, 'feed', ?3, 'epoch', ?4, 'position', ?5)
  END AS value FROM balances WHERE account = ?1`
	// floorUpsertReturning is the upsert and the emit in one.
	floorUpsertReturning = `INSERT INTO balances (account, balance) VALUES (?1, ?2)
  ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance
  RETURNING ?1 AS key,
  CASE WHEN (?1 || ?3 || ?4) GLOB '*[<>&]*' OR instr(?1 || ?3 || ?4, char(8232)) OR instr(?1 || ?3 || ?4, char(8233))
  THEN replace(json_object('account', ?1, 'amount', ?2, 'balance', balance, 'feed', ?3, 'epoch', ?4, 'position', ?5), '<', '\u003c')
  ELSE json_object('account', ?1, 'amount', ?2, 'balance', balance, 'feed', ?3, 'epoch', ?4, 'position', ?5)
  END AS value`
)

// BenchmarkFloor is the floor under the SQL ledger: a bare loop that, per
// line of the benchmark's ledger input (already split and parsed), runs the
// SQL ledger's three prepared statements (reject, upsert, then a SELECT of
// the output, as testdata/ledger.yaml) and emits the row; "returning" runs
// two instead, the reject and the upsert RETURNING the output, each line in
// its item (savepoint), batches of 4000 lines a transaction, through the
// same store. No feed, no decoding, no loop. "deadline" runs the
// statements with a context that has a deadline, as the loop's attempts
// do; "nodeadline" with one that has none, which the driver runs without
// its watcher goroutine. "raw" runs the three in the store's Batch
// (outbox.Tx.Batch), as the processor does: what is left is SQLite's own
// execution of the statements, the driver's binding and the store's
// savepoint and commit.
func BenchmarkFloor(b *testing.B) {
	for _, c := range []struct {
		name                 string
		deadline, three, raw bool
	}{
		{"deadline", true, true, false}, {"nodeadline", false, true, false},
		{"returning/deadline", true, false, false}, {"returning/nodeadline", false, false, false},
		{"raw/deadline", true, true, true}, {"raw/nodeadline", false, true, true},
	} {
		b.Run(c.name, func(b *testing.B) { benchmarkFloor(b, c.deadline, c.three, c.raw) })
	}
}

func benchmarkFloor(b *testing.B, deadline, three, raw bool) {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(b.TempDir(), "f.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL) STRICT`); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	accounts := make([]string, 1000)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("acct-%d", i)
	}
	sctx := ctx
	if deadline {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, time.Hour)
		defer cancel()
	}
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for done := 0; done < b.N; {
		n := min(4000, b.N-done)
		batch := floorBatch
		if raw {
			batch = floorBatchRaw
		}
		if err := batch(sctx, s, accounts, done, n, three); err != nil {
			b.Fatal(err)
		}
		done += n
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/line")
}

func floorBatch(ctx context.Context, s *outbox.Store, accounts []string, from, n int, three bool) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var key, value sql.RawBytes
	for i := from; i < from+n; i++ {
		acct, amt, pos := accounts[i%1000], int64(i%2001-1000), int64(i)*12
		if err := tx.BeginItem(outbox.Place{Feed: "ledger", Epoch: "e", Position: pos}); err != nil {
			return err
		}
		rej, err := tx.Stmt(ctx, floorReject)
		if err != nil {
			return err
		}
		rows, err := rej.QueryContext(ctx, acct, amt)
		if err != nil {
			return err
		}
		if rows.Next() {
			return fmt.Errorf("line %d rejected", i)
		}
		rows.Close()
		emit := floorUpsertReturning
		if three {
			up, err := tx.Stmt(ctx, floorUpsert)
			if err != nil {
				return err
			}
			if _, err := up.ExecContext(ctx, acct, amt); err != nil {
				return err
			}
			emit = floorEmit
		}
		em, err := tx.Stmt(ctx, emit)
		if err != nil {
			return err
		}
		rows, err = em.QueryContext(ctx, acct, amt, "ledger", "e", pos)
		if err != nil {
			return err
		}
		for rows.Next() {
			if err := rows.Scan(&key, &value); err != nil {
				return err
			}
			if err := tx.Emit(ctx, outbox.Output{Topic: "ledger.out", Key: key, Value: value}); err != nil {
				return err
			}
		}
		rows.Close()
		if err := tx.EndItem(); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// floorBatchRaw is floorBatch's three statements run in the store's
// Batch (its engine's fastest path), with the argument slice reused.
func floorBatchRaw(ctx context.Context, s *outbox.Store, accounts []string, from, n int, _ bool) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	rej, up, em := outbox.NewStatement(floorReject), outbox.NewStatement(floorUpsert), outbox.NewStatement(floorEmit)
	args := make([]any, 5)
	for i := from; i < from+n; i++ {
		acct, amt, pos := accounts[i%1000], int64(i%2001-1000), int64(i)*12
		if err := tx.BeginItem(outbox.Place{Feed: "ledger", Epoch: "e", Position: pos}); err != nil {
			return err
		}
		args[0], args[1], args[2], args[3], args[4] = acct, amt, "ledger", "e", pos
		err := tx.Batch(func(b *outbox.Batch) error {
			rows, err := b.Query(ctx, rej, args[:2]...)
			if err != nil {
				return err
			}
			if ok, err := rows.Next(); ok || err != nil {
				rows.Close()
				return fmt.Errorf("line %d rejected (%v)", i, err)
			}
			rows.Close()
			if err := b.Exec(ctx, up, args[:2]...); err != nil {
				return err
			}
			if rows, err = b.Query(ctx, em, args...); err != nil {
				return err
			}
			defer rows.Close()
			for {
				switch ok, err := rows.Next(); {
				case err != nil:
					return err
				case !ok:
					return nil
				}
				row := rows.Values()
				key, _ := row[0].(string)
				value, _ := row[1].(string)
				if err := tx.Emit(ctx, outbox.Output{Topic: "ledger.out", Key: []byte(key), Value: []byte(value)}); err != nil {
					return err
				}
			}
		})
		if err != nil {
			return err
		}
		if err := tx.EndItem(); err != nil {
			return err
		}
	}
	return tx.Commit()
}
