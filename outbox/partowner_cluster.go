package outbox

import (
	"context"
	"fmt"
)

// ClusterServer is a server sharing the database, as it last said it was
// alive (Share, SeenServer).
type ClusterServer struct {
	ID        string `db:"id" json:"id"`
	API       string `db:"api" json:"api"`
	StartedAt int64  `db:"started_at" json:"startedAt"` // unix nanoseconds
	SeenAt    int64  `db:"seen_at" json:"seenAt"`       // unix nanoseconds
}

// Share makes this store one of several servers' on the database, instead
// of its only owner (Claim): no database-wide claim is taken, so none
// fences the others; the group feeds' partition epochs (ClaimPartition)
// and the leases (AcquireLease) keep them apart. It records the server as
// id, its API at api, in the cluster's servers. Claimed reports true from
// then on.
func (s *Store) Share(ctx context.Context, id, api string) error {
	now := s.Now().UnixNano()
	if _, err := s.db.ExecContext(ctx, `INSERT INTO cluster_servers (id, api, started_at, seen_at) VALUES (?, ?, ?, ?)
ON CONFLICT(id) DO UPDATE SET api = excluded.api, started_at = excluded.started_at, seen_at = excluded.seen_at`,
		id, api, now, now); err != nil {
		s.noteWrite(err)
		return fmt.Errorf("join the servers of the database: %w", err)
	}
	s.shared.Store(true)
	return nil
}

// Shared reports whether the store shares its database (Share).
func (s *Store) Shared() bool { return s.shared.Load() }

// SeenServer records that server id is alive now.
func (s *Store) SeenServer(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE cluster_servers SET seen_at = ? WHERE id = ?`, s.Now().UnixNano(), id); err != nil {
		s.noteWrite(err)
		return fmt.Errorf("record server %s alive: %w", id, err)
	}
	return nil
}

// LeaveServer removes server id from the cluster's servers (a clean stop).
func (s *Store) LeaveServer(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM cluster_servers WHERE id = ?`, id); err != nil {
		return fmt.Errorf("leave the servers of the database: %w", err)
	}
	return nil
}

// ClusterServers returns the servers sharing the database, by id.
func (s *Store) ClusterServers(ctx context.Context) ([]ClusterServer, error) {
	var cs []ClusterServer
	if err := s.rdb.SelectContext(ctx, &cs, `SELECT id, api, started_at, seen_at FROM cluster_servers ORDER BY id`); err != nil {
		return nil, fmt.Errorf("read the servers of the database: %w", err)
	}
	return cs, nil
}
