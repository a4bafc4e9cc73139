package server

import (
	"context"
	"errors"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// watchEvery is how often a running server checks it still owns its
// database. Commits check it too; this catches an idle server.
const watchEvery = time.Second

// watchDatabase checks every interval, until ctx is done, that the store
// still owns its database: its path names the file it opened, and no
// other process claimed it since (outbox.Store.CheckOwner). It returns the
// first failure wrapping outbox.ErrMoved or outbox.ErrFenced, nil once ctx
// is done. A check that fails otherwise (the database busy or unreadable
// for a moment) is tried again at the next tick.
func watchDatabase(ctx context.Context, s *outbox.Store, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.CheckOwner(ctx); errors.Is(err, outbox.ErrFenced) {
			return err
		}
	}
}
