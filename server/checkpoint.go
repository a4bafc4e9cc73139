package server

import (
	"context"
	"time"
)

// checkpointEvery is how often the server checkpoints the write-ahead log
// itself: SQLite does inside commits once the log is long, and these keep
// it short when commits are rare and measure what a checkpoint costs.
const checkpointEvery = 30 * time.Second

// checkpoints runs a passive checkpoint every interval until ctx is done,
// and reports each to the metrics. A failed one is logged at debug level:
// the next commit or checkpoint does the same work, and a store that
// cannot write says so through the feeds and readiness.
func (m *Main) checkpoints(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r, err := m.Store.Checkpoint(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.Logger.Debug("WAL checkpoint", "err", err)
			}
			continue
		}
		m.API.Metrics().ObserveCheckpoint(r)
	}
}
