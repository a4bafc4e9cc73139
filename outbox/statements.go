package outbox

import (
	"context"
	"fmt"
)

// MaxRelayProgress is the largest outbox id any relay of this database has
// recorded in SQLite as published (0 for none), read through the read pool.
// The exactly-once relay records it right after each Kafka commit.
func (s *Store) MaxRelayProgress(ctx context.Context) (int64, error) {
	var id int64
	if err := s.rdb.GetContext(ctx, &id, `SELECT coalesce(max(last_id), 0) FROM relay_progress`); err != nil {
		return 0, fmt.Errorf("read relay progress: %w", err)
	}
	return id, nil
}
