package kafkafeed

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// doubtFetchBytes bounds each fetch that reads the new incarnation's records
// to compare them with the doubtful ones.
const doubtFetchBytes = 1 << 20

// doubtEnd settles which of doubt, the records s's consumer read from its
// topic but no metadata request confirmed before the topic was found
// re-created, were the old incarnation's. A fetch does not say which
// incarnation it read, so the consumer of the old epoch may have read its
// last records, or the new incarnation's first ones at the same offsets, or
// both in that order. A doubtful record was the new incarnation's when the
// new one holds the same record (key, value, headers, timestamp) at its
// offset, and the old one's when it holds none there: oldest and newest are
// the new incarnation's log start and high watermark, read after doubt was.
//
// doubtEnd returns the position after the last doubtful record that was
// the old incarnation's (it was read but is not applied: a loss), 0 when
// none was. When it cannot tell (the new incarnation's records there are
// gone, or cannot be fetched), it counts every doubtful record as the old
// incarnation's, so a loss is never missed.
func (f *Feed) doubtEnd(s *kafkaSlot, doubt []kafkaEntry, oldest, newest int64) int64 {
	if len(doubt) == 0 {
		return 0
	}
	first, last := doubt[0].rec.Position-1, doubt[len(doubt)-1].rec.Position-1
	all := last + 1
	if last >= newest {
		// The new incarnation had no record at that offset after the
		// consumer read one there: it was the old one's, and so were
		// all before it.
		return all
	}
	if first < oldest {
		f.slotLog(s).Warn("the new incarnation no longer holds the offsets of the records read before it was found: counting them lost",
			logFrom, first, logTo, all)
		return all
	}
	fresh, err := f.committedRecords(s, first, last+1)
	if err != nil {
		f.slotLog(s).Warn("reading the new incarnation to compare: counting the records read before it was found lost",
			logFrom, first, logTo, all, logErr, err)
		return all
	}
	for i, e := range doubt {
		if r, ok := fresh[e.rec.Position-1]; ok && r.same(e) {
			// Read in order: the old incarnation's records, if any, came
			// before the first of the new one's.
			if i == 0 {
				return 0
			}
			return doubt[i-1].rec.Position
		}
	}
	return all
}

// fetched is a record as a raw fetch returns it.
type fetched struct {
	key, value []byte
	headers    []*sarama.RecordHeader
	ts         time.Time
}

// same reports whether e, as the consumer gave it, is this record.
func (r fetched) same(e kafkaEntry) bool {
	it := e.rec.Item
	if !bytes.Equal(r.key, it.Key) || !bytes.Equal(r.value, it.Value) || !r.ts.Equal(e.ts) {
		return false
	}
	var hs []*sarama.RecordHeader
	for _, h := range r.headers {
		if h != nil {
			hs = append(hs, h)
		}
	}
	if len(hs) != len(it.Headers) {
		return false
	}
	for i, h := range hs {
		if string(h.Key) != it.Headers[i].Key || !bytes.Equal(h.Value, it.Headers[i].Value) {
			return false
		}
	}
	return true
}

// committedRecords reads partition s from offset from to offset to (or the
// last stable offset, if lower) and returns its committed records by
// offset, as a read_committed consumer gets them.
func (f *Feed) committedRecords(s *kafkaSlot, from, to int64) (map[int64]fetched, error) {
	b, err := f.client.Leader(s.topic, s.part)
	if err != nil {
		return nil, err
	}
	out := map[int64]fetched{}
	for next := from; next < to; {
		req := &sarama.FetchRequest{Version: 11, MaxBytes: doubtFetchBytes, Isolation: sarama.ReadCommitted, SessionEpoch: -1}
		req.AddBlock(s.topic, s.part, next, doubtFetchBytes, -1)
		resp, err := b.Fetch(req)
		if err != nil {
			return nil, fmt.Errorf("fetch %s[%d] at %d: %w", s.topic, s.part, next, err)
		}
		block := resp.GetBlock(s.topic, s.part)
		if block == nil {
			return nil, fmt.Errorf("fetch %s[%d] at %d: %w", s.topic, s.part, next, sarama.ErrIncompleteResponse)
		}
		if !errors.Is(block.Err, sarama.ErrNoError) {
			return nil, fmt.Errorf("fetch %s[%d] at %d: %w", s.topic, s.part, next, block.Err)
		}
		to = min(to, block.LastStableOffset)
		end := collectCommitted(block, next, out)
		if end <= next {
			if next < to {
				return nil, fmt.Errorf("fetch %s[%d] at %d: no progress", s.topic, s.part, next)
			}
			break
		}
		next = end
	}
	return out, nil
}

// collectCommitted adds the committed records of block at or after from to
// out, and returns the offset after the last whole batch it holds.
func collectCommitted(block *sarama.FetchResponseBlock, from int64, out map[int64]fetched) int64 {
	end, _ := walkBatches(block, from, func(batch *sarama.RecordBatch, _ int64, committed bool) bool {
		if !committed {
			return true
		}
		for _, rec := range batch.Records {
			off := batch.FirstOffset + rec.OffsetDelta
			if off < from {
				continue
			}
			ts := batch.FirstTimestamp.Add(rec.TimestampDelta)
			if batch.LogAppendTime {
				ts = batch.MaxTimestamp
			}
			out[off] = fetched{key: rec.Key, value: rec.Value, headers: rec.Headers, ts: ts}
		}
		return true
	})
	return end
}

// walkBatches calls f, in order, with each whole record batch of block,
// its last offset and whether a read_committed reader gets its records
// (neither a control batch nor one of an aborted transaction), until f
// returns false. end is the offset after the last batch f went on from
// (at least from); cut reports that the walk stopped at an old format or a
// cut batch, where the next fetch starts.
func walkBatches(block *sarama.FetchResponseBlock, from int64,
	f func(batch *sarama.RecordBatch, last int64, committed bool) bool) (end int64, cut bool) {
	aborted := map[int64]bool{}
	txns := block.AbortedTransactions
	end = from
	for _, rs := range block.RecordsSet {
		batch := rs.RecordBatch
		if batch == nil || batch.PartialTrailingRecord {
			return end, true
		}
		last := batch.FirstOffset + int64(batch.LastOffsetDelta)
		for len(txns) > 0 && txns[0].FirstOffset <= last {
			aborted[txns[0].ProducerID] = true
			txns = txns[1:]
		}
		committed := false
		switch {
		case batch.Control:
			if isAbortMarker(batch) {
				delete(aborted, batch.ProducerID)
			}
		case batch.IsTransactional && aborted[batch.ProducerID]:
		default:
			committed = true
		}
		if !f(batch, last, committed) {
			return end, false
		}
		end = max(end, last+1)
	}
	return end, false
}
