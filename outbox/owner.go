package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// ErrFenced is returned by Tx.Commit once another process has claimed the
// database (Claim): this process must stop writing, as a Kafka producer
// fenced by a newer one with its transactional id. Errors wrapping ErrMoved
// (the database file was deleted or replaced) match it too.
var ErrFenced = errors.New("another outboxd process has claimed this database")

const ownerKey = "owner"

// claimSQL takes the next owner generation; ownerInTxSQL reads it inside
// a batch's transaction (on PostgreSQL FOR SHARE, see pg_engine.go).
const (
	claimSQL = `INSERT INTO meta (key, value) VALUES (?, '1')
ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1`
	ownerInTxSQL = `SELECT value FROM meta WHERE key = ? /* in the batch */`
)

// Claim makes this store the database's only writer of ingest transactions:
// it takes the next owner generation, and from then on every Tx.Commit
// checks, inside its write transaction, that no later Claim has happened.
// So two servers on one database never both apply items: the older one's
// next commit fails with ErrFenced. A replay copy is refused with
// ErrReplayCopy.
func (s *Store) Claim(ctx context.Context) (int64, error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("claim database: %w", err)
	}
	defer tx.Rollback()
	if err := refuseReplayCopy(ctx, tx); err != nil {
		return 0, fmt.Errorf("claim database: %w", err)
	}
	if _, err := tx.ExecContext(ctx, claimSQL, ownerKey); err != nil {
		return 0, fmt.Errorf("claim database: %w", err)
	}
	var v string
	if err := tx.GetContext(ctx, &v, `SELECT value FROM meta WHERE key = ?`, ownerKey); err != nil {
		return 0, fmt.Errorf("claim database: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("claim database: %w", err)
	}
	gen, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("claim database: owner generation %q: %w", v, err)
	}
	s.owner.Store(gen)
	return gen, nil
}

// Claimed reports whether this store has claimed its database, or shares
// it with other servers (Share).
func (s *Store) Claimed() bool { return s.owner.Load() != 0 || s.shared.Load() }

// CheckOwner reports whether this store still owns its database: nil when
// its path still names the file it opened (CheckPath) and it holds the
// latest claim, or has never claimed (a store used without Claim has no
// claim to lose); an error wrapping ErrMoved or ErrFenced otherwise. It
// reads through the read-only pool, so it never waits behind a batch. It
// is safe for concurrent use.
func (s *Store) CheckOwner(ctx context.Context) error {
	if err := s.CheckPath(); err != nil {
		return err
	}
	gen := s.owner.Load()
	if gen == 0 {
		return nil
	}
	var v string
	if err := s.rdb.GetContext(ctx, &v, `SELECT value FROM meta WHERE key = ?`, ownerKey); err != nil {
		return fmt.Errorf("check database owner: %w", err)
	}
	return ownerIs(v, gen)
}

func ownerIs(v string, gen int64) error {
	if v != strconv.FormatInt(gen, 10) {
		return fmt.Errorf("%w (generation %s, this process has %d)", ErrFenced, v, gen)
	}
	return nil
}

// checkOwner fails with ErrFenced when the database was claimed after this
// store's own Claim, and with ErrMoved when the path no longer names the
// file the store has open (a commit there would be lost). It runs inside
// the write transaction, so the claim check and the commit are atomic.
func (tx *Tx) checkOwner() error {
	if err := tx.store.CheckPath(); err != nil {
		return err
	}
	if err := tx.checkPartitions(); err != nil {
		return err
	}
	gen := tx.store.owner.Load()
	if gen == 0 {
		return nil
	}
	var v string
	if err := tx.tx.GetContext(txCtx(), &v, ownerInTxSQL, ownerKey); err != nil {
		return fmt.Errorf("check database owner: %w", err)
	}
	return ownerIs(v, gen)
}
