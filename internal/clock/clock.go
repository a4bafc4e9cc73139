// Package clock holds outboxd's waits that end early when their context
// is done, shared by the ingest loop, the feeds and the relay.
package clock

import (
	"context"
	"time"
)

// Sleep waits d or until ctx is done, whichever comes first. It returns
// nil when d passed and ctx.Err() when ctx ended the wait. A d of zero or
// less does not wait: it returns ctx.Err() at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
