package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// This file holds what a replay needs beyond the general store API.

// DeadLetterAt returns the id of the oldest dead letter of feed at the
// given place that was not requeued yet: the one a recorded requeue of
// that place applied. It returns an error wrapping ErrNotFound when there
// is none.
func (s *Store) DeadLetterAt(ctx context.Context, feed string, partition int32, epoch string, position int64) (int64, error) {
	var id int64
	err := s.db.GetContext(ctx, &id, `SELECT id FROM dead_letters
WHERE feed = ? AND partition = ? AND epoch = ? AND position = ? AND requeued_at = 0 AND outbox_id IS NULL
ORDER BY id LIMIT 1`, feed, partition, epoch, position)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("dead letter of %s[%d] epoch %s position %d: %w", feed, partition, epoch, position, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("find the dead letter of %s[%d] position %d: %w", feed, partition, position, err)
	}
	return id, nil
}
