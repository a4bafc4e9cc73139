package ingest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// backlogPoll is how often a loop held by the backlog's bound looks at the
// backlog again (an in-memory figure: see outbox.Store.PendingBacklog).
const backlogPoll = 100 * time.Millisecond

// backlogResume is the share of the bound the backlog must fall to before
// a held loop resumes, so that a loop near the bound does not pause and
// resume at every batch.
const backlogResume = 0.9

// EndLooker is implemented by feeds that can look at their source's end
// without reading it (a file's size). LookEnds updates what Ends returns;
// the loop calls it while it reads nothing, held at the backlog's bound,
// so that the status's end and lag follow the source meanwhile.
type EndLooker interface {
	LookEnds()
}

// lookEnds lets the feed look at its source's ends, when it can.
func (l *Loop) lookEnds() {
	if el, ok := l.feed.(EndLooker); ok {
		el.LookEnds()
	}
}

// holdForBacklog waits, between batches, while the outbox backlog is past
// Config.MaxBacklog: the feed is read no further, so nothing fills the
// disk while the relay cannot publish, and nothing read is lost (it is
// not committed, so the feed gives it again). The state says
// backpressure meanwhile; requeues are applied. It returns ctx's error
// when ctx ends first, or the error that ends the feed, met by a requeue.
// A backlog that cannot be read does not hold the loop: the bound
// protects the disk, it must not stop ingest by itself.
func (l *Loop) holdForBacklog(ctx context.Context) error {
	lim := l.cfg.MaxBacklog
	if lim.IsZero() {
		return nil
	}
	p, err := l.store.PendingBacklog(ctx)
	if err != nil || !lim.Exceeded(p) {
		return nil
	}
	l.status.backpressure(pressure(p, lim))
	l.lookEnds()
	l.log.Warn("the outbox backlog is past its bound: ingest waits for the relay to publish",
		"rows", p.Rows, "bytes", p.Bytes, "max_rows", lim.Rows, "max_bytes", lim.Bytes)
	started := time.Now()
	t := time.NewTicker(backlogPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.reqs.signal:
			if err := l.serveRequeues(); err != nil {
				return err
			}
			continue
		case <-t.C:
		}
		p, err = l.store.PendingBacklog(ctx)
		if err != nil || lim.Below(p, backlogResume) {
			break
		}
		l.status.backpressure(pressure(p, lim))
		l.lookEnds()
	}
	l.status.move()
	l.log.Info("the outbox backlog is below its bound: ingest resumes", "rows", p.Rows, "bytes", p.Bytes,
		"waited", time.Since(started).Round(time.Millisecond))
	return nil
}

// pressure says how far past its bound the backlog is.
func pressure(p outbox.Pending, lim outbox.BacklogLimit) error {
	var bounds []string
	if lim.Bytes > 0 {
		bounds = append(bounds, "at most "+FormatBytes(lim.Bytes))
	}
	if lim.Rows > 0 {
		bounds = append(bounds, fmt.Sprintf("at most %d rows", lim.Rows))
	}
	return fmt.Errorf("outbox backlog of %d rows, %s is past its bound (%s): waiting for the relay to publish it below %d%%",
		p.Rows, FormatBytes(p.Bytes), strings.Join(bounds, ", "), int(backlogResume*100))
}

// FormatBytes writes n bytes for people: "512 B", "3.2 MiB", "1.0 GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
