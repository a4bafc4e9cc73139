package relay

import (
	"context"
	"time"
)

// backlogEvery is how often the pending count in Status is refreshed.
const backlogEvery = time.Second

// maintain refreshes the backlog in Status and prunes published rows, until
// ctx is done.
func (r *Relay) maintain(ctx context.Context) {
	backlog := time.NewTicker(backlogEvery)
	defer backlog.Stop()
	prune := time.NewTicker(r.pruneEvery())
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-backlog.C:
			r.refreshBacklog(ctx)
		case <-prune.C:
			r.prune(ctx)
		case <-r.pruneNow:
			r.prune(ctx)
		}
	}
}

// pruneEvery spaces prunes: the rows a prune removes have waited Retention
// already, so a hundredth of it (between a second and a minute) is soon
// enough; each pass costs one chunk of the oldest rows.
func (r *Relay) pruneEvery() time.Duration {
	return min(max(r.cfg.Retention/100, time.Second), time.Minute)
}

// prunePublished asks for a prune right away when rows are kept for no
// time at all.
func (r *Relay) prunePublished() {
	if r.cfg.Retention > 0 {
		return
	}
	select {
	case r.pruneNow <- struct{}{}:
	default:
	}
}

// prune deletes the rows published (and recorded in SQLite) longer than
// Retention ago, in bulk, never past a row a configured sink has not
// taken yet (outbox.Store.ConsumedThrough).
func (r *Relay) prune(ctx context.Context) {
	through := min(r.recorded.Load(), r.store.ConsumedThrough())
	if through <= 0 {
		return
	}
	n, err := r.store.Prune(ctx, through, r.store.Now().Add(-r.cfg.Retention))
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("pruning published rows failed", "through", through, "err", err)
		}
		return
	}
	if n > 0 {
		r.st.update(func(s *Status) { s.Pruned += n })
		r.log.Debug("pruned published rows", "through", through, "rows", n)
	}
}

// refreshBacklog counts the rows after the last published one.
func (r *Relay) refreshBacklog(ctx context.Context) {
	b, err := r.store.Backlog(ctx, "", r.st.lastPublished())
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("counting the backlog failed", "err", err)
		}
		return
	}
	r.st.backlog(b.Pending, b.OldestAt)
}
