package kafkafeed

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/IBM/sarama"
)

const (
	// kafkaTailIdle is how long a partition gets no record before its tail
	// is looked at.
	kafkaTailIdle = 200 * time.Millisecond
	// kafkaTailBytes bounds the fetch that looks at a tail.
	kafkaTailBytes = 1 << 20
)

// refreshEnds reads the high watermark of each partition whose consumer
// gave nothing lately (caught up, or waiting for Poll to make room), so the
// end a re-created topic's old incarnation had is known even where its
// last records were never fetched. What it reads is only seen: the next
// metadata request confirms it is the epoch's (see confirm).
func (f *Feed) refreshEnds() {
	var idle []*kafkaSlot
	f.mu.Lock()
	for _, s := range f.order {
		if s.run != nil && !s.run.ended && time.Since(s.pushedAt) >= kafkaTailIdle {
			idle = append(idle, s)
		}
	}
	f.mu.Unlock()
	for _, s := range idle {
		hwm, err := f.client.GetOffset(s.topic, s.part, sarama.OffsetNewest)
		if err != nil {
			continue // the next tick tries again
		}
		f.mu.Lock()
		s.seen = max(s.seen, hwm)
		f.mu.Unlock()
	}
}

// probeTails looks past the last record of each idle partition whose high
// watermark is ahead of its position. On a topic written in transactions
// (a retry topic, written by the relay) the offsets there may hold only
// commit markers and aborted records, which a read_committed reader never
// gets: then the partition is read to its end, and its end is its position,
// so the loop and the status see it caught up rather than lagging forever
// (once the next metadata request confirms it).
func (f *Feed) probeTails() {
	type tail struct {
		s    *kafkaSlot
		next int64
	}
	var tails []tail
	f.mu.Lock()
	for _, s := range f.order {
		if s.run != nil && !s.run.ended && len(s.pending) == 0 && s.seen > s.next && time.Since(s.pushedAt) >= kafkaTailIdle {
			tails = append(tails, tail{s, s.next})
		}
	}
	f.mu.Unlock()
	for _, t := range tails {
		end, ok := f.readableEnd(t.s, t.next)
		if !ok || end != t.next {
			continue
		}
		f.mu.Lock()
		if t.s.next == t.next && len(t.s.pending) == 0 {
			t.s.seen = t.next
		}
		f.mu.Unlock()
	}
}

// readableEnd fetches partition s from next and returns next when nothing
// a read_committed reader gets lies between next and the end of the log.
// ok is false when the fetch fails or cannot tell.
func (f *Feed) readableEnd(s *kafkaSlot, next int64) (int64, bool) {
	b, err := f.client.Leader(s.topic, s.part)
	if err != nil {
		return 0, false
	}
	req := &sarama.FetchRequest{Version: 11, MaxBytes: kafkaTailBytes, Isolation: sarama.ReadCommitted, SessionEpoch: -1}
	req.AddBlock(s.topic, s.part, next, kafkaTailBytes, -1)
	resp, err := b.Fetch(req)
	if err != nil {
		return 0, false
	}
	block := resp.GetBlock(s.topic, s.part)
	if block == nil || !errors.Is(block.Err, sarama.ErrNoError) || block.LastStableOffset != block.HighWaterMarkOffset {
		return 0, false // an open transaction: its records may yet count
	}
	if readable, covered := scanTail(block, next); readable || !covered {
		return 0, false
	}
	return next, true
}

// scanTail reports whether the fetched batches hold a record a
// read_committed reader gets, and whether they cover the log from next to
// its last stable offset.
func scanTail(block *sarama.FetchResponseBlock, next int64) (readable, covered bool) {
	end, cut := walkBatches(block, next, func(_ *sarama.RecordBatch, last int64, committed bool) bool {
		readable = committed && last >= next
		return !readable
	})
	switch {
	case readable:
		return true, true
	case cut:
		return true, false // an old format or a cut batch: cannot tell
	}
	return false, end >= block.LastStableOffset
}

// isAbortMarker reports whether a control batch ends a transaction by
// aborting it: its record's key is a version and a type, 0 for abort.
func isAbortMarker(batch *sarama.RecordBatch) bool {
	if len(batch.Records) == 0 || len(batch.Records[0].Key) < 4 {
		return false
	}
	return binary.BigEndian.Uint16(batch.Records[0].Key[2:4]) == 0
}
