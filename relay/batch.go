package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// nextBatch returns the next rows after id after: at least one and at most
// Config.Batch, in id order. It blocks until a row is there, woken by the
// store's commit signal or, failing that, the poll interval. It returns
// ctx's error once ctx is done.
func (r *Relay) nextBatch(ctx context.Context, after int64) ([]outbox.Row, error) {
	for {
		rows, err := r.readRows(ctx, after, r.cfg.Batch)
		if err != nil {
			return nil, err
		}
		if len(rows) > 0 {
			return r.fill(ctx, rows)
		}
		if err := r.awaitRows(ctx); err != nil {
			return nil, err
		}
	}
}

// fill lets a short batch wait up to Config.Wait for more rows.
func (r *Relay) fill(ctx context.Context, rows []outbox.Row) ([]outbox.Row, error) {
	if len(rows) >= r.cfg.Batch || r.cfg.Wait <= 0 {
		return rows, nil
	}
	deadline := time.NewTimer(r.cfg.Wait)
	defer deadline.Stop()
	for len(rows) < r.cfg.Batch {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return rows, nil
		case <-r.store.Committed():
		}
		more, err := r.readRows(ctx, rows[len(rows)-1].ID, r.cfg.Batch-len(rows))
		if err != nil {
			return nil, err
		}
		rows = append(rows, more...)
	}
	return rows, nil
}

// readRows returns up to limit rows after id after: those the store's own
// commits just wrote from memory, the others from SQLite.
func (r *Relay) readRows(ctx context.Context, after int64, limit int) ([]outbox.Row, error) {
	if rows := r.store.RecentRows(after, limit); len(rows) > 0 {
		return rows, nil
	}
	rows, err := r.store.RelayRows(ctx, after, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStore, err)
	}
	return rows, nil
}

// awaitRows waits for an ingest commit, the poll interval or ctx.
func (r *Relay) awaitRows(ctx context.Context) error {
	t := time.NewTimer(r.cfg.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.store.Committed():
	case <-t.C:
	}
	return nil
}

// feeder reads batches ahead of the publisher: while one batch is in a
// Kafka transaction, the next one is read from SQLite. The channel is
// unbuffered, so at most two batches are in memory (one being published,
// one ready), however long the backlog.
type feeder struct {
	ch   chan fed
	stop context.CancelFunc
	done chan struct{}
}

type fed struct {
	rows []outbox.Row
	err  error
}

// startFeeder reads the rows after id after, batch by batch, until ctx is
// done or a read fails.
func (r *Relay) startFeeder(ctx context.Context, after int64) *feeder {
	ctx, cancel := context.WithCancel(ctx)
	f := &feeder{ch: make(chan fed), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for {
			rows, err := r.nextBatch(ctx, after)
			select {
			case f.ch <- fed{rows, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
			after = rows[len(rows)-1].ID
		}
	}()
	return f
}

// next returns the next batch, marking the relay idle while it waits for
// one. It returns ctx's error once ctx is done.
func (f *feeder) next(ctx context.Context, idle func()) ([]outbox.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // shutting down: no new transaction, even if a batch is ready
	}
	select {
	case b := <-f.ch:
		return b.rows, b.err
	default:
	}
	idle()
	select {
	case b := <-f.ch:
		return b.rows, b.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close stops the feeder and waits for it.
func (f *feeder) close() {
	f.stop()
	<-f.done
}
