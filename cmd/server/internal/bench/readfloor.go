package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/server"
)

// runReadFloor measures the read floor: the file feed the server runs,
// polled to the file's end --batch-max records at a time, with no store.
// The engine reads the same file through the same feed, so no ingest can
// be faster.
func (b *bench) runReadFloor(ctx context.Context) error {
	feed := filefeed.New(b.data.Path, filefeed.Options{MaxLine: server.DefaultConfig().MaxLine, Logger: b.log})
	m := b.startInProcess()
	start := time.Now()
	if err := feed.Open(ctx, nil); err != nil {
		return fmt.Errorf("open the file feed: %w", err)
	}
	defer feed.Close()
	buf := make([]ingest.Record, 0, b.o.BatchMax)
	var items int64
	for items < b.data.Lines {
		var err error
		if buf, err = feed.Poll(ctx, buf[:0], b.o.BatchMax); err != nil {
			return fmt.Errorf("read the file feed: %w", err)
		}
		for _, r := range buf {
			if r.Kind == ingest.RecordItem {
				items++
			}
		}
	}
	res := newPhaseResult(items, time.Since(start))
	m.finish(b, "read_floor", res)
	b.res.ReadFloor = res
	return nil
}
