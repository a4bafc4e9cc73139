package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Lease is a named lease as the store has it (the relay's leader, say).
type Lease struct {
	Name      string `db:"name" json:"name"`
	Holder    string `db:"holder" json:"holder"`
	Term      int64  `db:"term" json:"term"`
	ExpiresAt int64  `db:"expires_at" json:"expiresAt"` // unix nanoseconds
	RenewedAt int64  `db:"renewed_at" json:"renewedAt"` // unix nanoseconds
}

// acquireLeaseSQL takes a lease that is free, expired or the holder's own,
// with the next term; it returns no row when another holds it.
const acquireLeaseSQL = `INSERT INTO leases (name, holder, term, expires_at, renewed_at) VALUES (?, ?, 1, ?, ?)
ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, term = leases.term + 1,
expires_at = excluded.expires_at, renewed_at = excluded.renewed_at
WHERE leases.holder = excluded.holder OR leases.expires_at <= excluded.renewed_at
RETURNING term`

// AcquireLease takes lease name for holder for ttl, when no one else
// holds it unexpired: it returns the new term (every taking bumps it,
// never reused) and true, or 0 and false while another holds it. The
// servers' clocks must agree to well within ttl.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (int64, bool, error) {
	now := s.Now()
	var term int64
	err := s.db.GetContext(ctx, &term, acquireLeaseSQL, name, holder, now.Add(ttl).UnixNano(), now.UnixNano())
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		s.noteWrite(err)
		return 0, false, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	return term, true, nil
}

// RenewLease extends holder's lease of term for ttl from now. It returns
// false when the lease is no longer the holder's at that term (another
// took it once it expired).
func (s *Store) RenewLease(ctx context.Context, name, holder string, term int64, ttl time.Duration) (bool, error) {
	now := s.Now()
	res, err := s.db.ExecContext(ctx, `UPDATE leases SET expires_at = ?, renewed_at = ? WHERE name = ? AND holder = ? AND term = ?`,
		now.Add(ttl).UnixNano(), now.UnixNano(), name, holder, term)
	if err != nil {
		s.noteWrite(err)
		return false, fmt.Errorf("renew lease %s: %w", name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("renew lease %s: %w", name, err)
	}
	return n == 1, nil
}

// ReleaseLease ends holder's lease of term at once (a clean stop), so
// another takes it without waiting for it to expire.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string, term int64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ? AND term = ?`,
		name, holder, term); err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}

// Leases returns the stored leases, by name.
func (s *Store) Leases(ctx context.Context) ([]Lease, error) {
	var ls []Lease
	if err := s.rdb.SelectContext(ctx, &ls, `SELECT name, holder, term, expires_at, renewed_at FROM leases ORDER BY name`); err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	return ls, nil
}
