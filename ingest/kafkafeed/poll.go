package kafkafeed

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/ingest"
)

// Poll appends up to max (at least 1) ready records to buf: records whose
// topic a metadata request confirmed after they arrived, and whose due time
// (if any) has come. It returns as soon as one is ready, with as many as
// are, taking partitions in turn; otherwise it waits. It returns ctx.Err()
// when ctx is done first, and an error wrapping fs.ErrClosed after Close.
// With ctx done already it still hands over the records ready (see
// ingest.Feed).
func (f *Feed) Poll(ctx context.Context, buf []ingest.Record, maxRecords int) ([]ingest.Record, error) {
	start, limit := len(buf), len(buf)+max(maxRecords, 1)
	for {
		f.mu.Lock()
		if err := f.usable(); err != nil {
			f.mu.Unlock()
			return buf, err
		}
		var wake time.Time
		var unconfirmed bool
		buf, wake, unconfirmed = f.take(buf, limit, time.Now())
		f.mu.Unlock()
		if len(buf) > start {
			return buf, nil
		}
		if unconfirmed {
			signal(f.checkReq)
		}
		if err := ctx.Err(); err != nil {
			return buf, err
		}
		if err := f.waitReady(ctx, wake); err != nil {
			return buf, err
		}
	}
}

// take moves ready records from the slots to buf, up to limit. It returns
// the earliest due time of a record held back for it (zero if none), and
// whether a record waits for confirmation. f.mu is held.
func (f *Feed) take(buf []ingest.Record, limit int, now time.Time) ([]ingest.Record, time.Time, bool) {
	var wake time.Time
	unconfirmed := false
	n := len(f.order)
	for i := 0; i < n && len(buf) < limit; i++ {
		s := f.order[(f.rr+i)%n]
		took := false
		for len(s.pending) > 0 && len(buf) < limit {
			e := s.pending[0]
			if !e.verified && !e.at.Before(f.verified[s.topic]) {
				unconfirmed = true
				break
			}
			if e.due.After(now) {
				if wake.IsZero() || e.due.Before(wake) {
					wake = e.due
				}
				break
			}
			buf = append(buf, e.rec)
			s.yielded = recordEnd(e.rec)
			s.pending[0] = kafkaEntry{}
			s.pending = s.pending[1:]
			took = true
		}
		if len(s.pending) == 0 {
			s.pending = nil
		}
		if took {
			signal(s.space)
		}
	}
	if n > 0 {
		f.rr = (f.rr + 1) % n
	}
	return buf, wake, unconfirmed
}

// waitReady waits until a record may be ready, wake passes (when not zero),
// the feed is closed (nil: Poll then reports it) or ctx is done.
func (f *Feed) waitReady(ctx context.Context, wake time.Time) error {
	var timer <-chan time.Time
	if !wake.IsZero() {
		t := time.NewTimer(time.Until(wake))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-f.done:
	case <-f.ready:
	case <-timer:
	}
	return nil
}
