package kafkafeed

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox"
)

const (
	// kafkaMaxPending bounds the records a partition holds read but not
	// yet polled; past it the partition's consumer waits.
	kafkaMaxPending = 4096
	// kafkaErrorLogEvery spaces the logs of a partition's consumer errors.
	kafkaErrorLogEvery = 30 * time.Second
)

// kafkaSlot is one feed partition: where it stands and what it holds. Its
// fields are guarded by the feed's mu.
type kafkaSlot struct {
	feedPart int32
	topic    string
	ti       int
	part     int32

	epoch   string // the epoch of the records queued last ("" until known)
	next    int64  // the position after the last record queued: the offset to read next
	yielded int64  // the position after the last record Poll took
	// end is the epoch's end as confirmed: the high watermark (or next,
	// when only markers follow it) that a metadata request sent after it
	// was seen shows to be the epoch's. seen is the latest one seen, which
	// may be a later incarnation's until a request confirms it.
	end  int64
	seen int64

	// doubt holds the records read but not confirmed when the topic was
	// found re-created: they may be the old incarnation's last records or
	// the new one's first, read at the old one's offsets. The new epoch's
	// start settles which (see doubtEnd).
	doubt []kafkaEntry

	pushedAt time.Time // when its consumer last gave a record

	pending []kafkaEntry
	run     *kafkaRun     // the consumer reading it; nil when none
	space   chan struct{} // Poll took records: a full slot may take more
}

// kafkaEntry is a record read and not yet polled.
type kafkaEntry struct {
	rec      ingest.Record
	at       time.Time // when it arrived
	ts       time.Time // the record's Kafka timestamp
	due      time.Time // not before (zero: at once)
	verified bool      // needs no metadata confirmation (epochs, losses)
}

// recordEnd returns the position a slot stands at after r.
func recordEnd(r ingest.Record) int64 {
	if r.Kind == ingest.RecordLoss {
		return r.To
	}
	return r.Position
}

// queue appends a control record (epoch or loss) to s. f.mu is held.
func (s *kafkaSlot) queue(r ingest.Record) {
	r.Partition = s.feedPart
	s.pending = append(s.pending, kafkaEntry{rec: r, at: time.Now(), verified: true})
	s.next = recordEnd(r)
}

// dropUnverified takes out the records that arrived at or after since (the
// start of the last metadata request that confirmed their topic), which no
// request confirmed, moves s.next back to the last record kept, and returns
// the records taken out, in order. f.mu is held.
func (s *kafkaSlot) dropUnverified(since time.Time) []kafkaEntry {
	var kept, dropped []kafkaEntry
	for _, e := range s.pending {
		if e.verified || e.at.Before(since) {
			kept = append(kept, e)
		} else {
			dropped = append(dropped, e)
		}
	}
	s.pending = kept
	s.next = s.yielded
	if len(kept) > 0 {
		s.next = recordEnd(kept[len(kept)-1].rec)
	}
	return dropped
}

// kafkaRun is one partition consumer and the goroutine that moves its
// records into the slot.
type kafkaRun struct {
	pc       sarama.PartitionConsumer
	epoch    string
	since    time.Time // when it was started
	quit     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	ended    bool // the consumer shut itself down; guarded by the feed's mu
}

// stop ends the run and waits for its goroutine.
func (r *kafkaRun) stop() {
	r.stopOnce.Do(func() { close(r.quit) })
	<-r.done
}

// startRun starts reading s at offset from in epoch. The caller has set s
// up (epoch, next, control records) under f.mu.
func (f *Feed) startRun(s *kafkaSlot, epoch string, from int64) error {
	pc, err := f.consumer.ConsumePartition(s.topic, s.part, from)
	if err != nil {
		return fmt.Errorf("consume %s[%d] from %d: %w", s.topic, s.part, from, err)
	}
	r := &kafkaRun{pc: pc, epoch: epoch, since: time.Now(), quit: make(chan struct{}), done: make(chan struct{})}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		pc.Close()
		return errFeedClosed
	}
	s.run = r
	f.mu.Unlock()
	f.wg.Add(1)
	go f.pump(s, r)
	return nil
}

var errFeedClosed = errors.New("kafka feed closed")

// pump moves r's records into s until r is stopped or its consumer ends.
// It reads promptly, so sarama's fetches for the other partitions do not
// wait on this one; only a full slot makes it wait.
func (f *Feed) pump(s *kafkaSlot, r *kafkaRun) {
	defer f.wg.Done()
	defer close(r.done)
	msgs, errs := r.pc.Messages(), r.pc.Errors()
	var logged time.Time // errors repeat while a topic is gone: log them now and then
	var resume <-chan time.Time
	refused := false // a refusal of this topic is recorded
	for msgs != nil || errs != nil {
		select {
		case <-r.quit:
			r.pc.AsyncClose()
			drain(msgs, errs)
			return
		case <-resume:
			resume = nil
			r.pc.Resume()
		case m, ok := <-msgs:
			if !ok {
				msgs = nil
				continue
			}
			if refused && f.troubles.clear(troubleFetch+s.topic) {
				f.slotLog(s).Info("Kafka lets the feed read the topic again")
			}
			refused = false
			if !f.push(s, r, m) {
				r.pc.AsyncClose()
				drain(msgs, errs)
				return
			}
		case e, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			if f.fetchRefused(s, e.Err) {
				// sarama would fetch again every retry backoff: ask seldom,
				// an operator must grant the ACL.
				refused = true
				r.pc.Pause()
				resume = time.After(f.cfg.RefusedRetry)
				continue
			}
			if time.Since(logged) >= kafkaErrorLogEvery {
				logged = time.Now()
				f.slotLog(s).Warn("consuming (sarama retries)", logErr, e.Err)
			}
		}
	}
	// The consumer shut itself down (an offset out of range, retries
	// spent): the manager looks at the topic again and restarts it.
	f.mu.Lock()
	r.ended = true
	f.mu.Unlock()
	signal(f.checkReq)
}

// fetchRefused records err as the refusal of reading s's topic when it is
// one, logging it once, and reports whether it was.
func (f *Feed) fetchRefused(s *kafkaSlot, err error) bool {
	err = kafkasec.Denied(fmt.Errorf("fetch %s: %w", s.topic, err), f.cfg.Kafka.Principal(),
		kafkasec.Ask{Op: "Read", Resource: kafkasec.ResourceTopic, Name: s.topic})
	changed, refused := f.troubles.set(troubleFetch+s.topic, err)
	if changed {
		f.slotLog(s).Error("Kafka refused the feed its records: nothing is read until an operator grants it; asking again every "+
			f.cfg.RefusedRetry.String(), logErr, err)
	}
	return refused
}

// drain empties a closing consumer's channels so it can finish.
func drain(msgs <-chan *sarama.ConsumerMessage, errs <-chan *sarama.ConsumerError) {
	for msgs != nil || errs != nil {
		select {
		case _, ok := <-msgs:
			if !ok {
				msgs = nil
			}
		case _, ok := <-errs:
			if !ok {
				errs = nil
			}
		}
	}
}

// push queues m in s, waiting while s is full. It returns false when r was
// stopped or replaced meanwhile; m is then dropped, as r's reads are void.
func (f *Feed) push(s *kafkaSlot, r *kafkaRun, m *sarama.ConsumerMessage) bool {
	e := kafkaEntry{rec: f.itemRecord(s, r.epoch, m), at: time.Now(), ts: m.Timestamp}
	if s.ti > 0 {
		e.due, _ = ingest.RetryDue(e.rec.Item.Headers)
	}
	f.mu.Lock()
	for len(s.pending) >= kafkaMaxPending && s.run == r {
		f.mu.Unlock()
		select {
		case <-s.space:
		case <-r.quit:
			return false
		}
		f.mu.Lock()
	}
	if s.run != r {
		f.mu.Unlock()
		return false
	}
	s.pending = append(s.pending, e)
	s.next = e.rec.Position
	s.seen = max(s.seen, r.pc.HighWaterMarkOffset())
	s.pushedAt = e.at
	f.mu.Unlock()
	signal(f.checkReq) // confirm its topic, so it can be yielded
	return true
}

// itemRecord makes the item record of m.
func (f *Feed) itemRecord(s *kafkaSlot, epoch string, m *sarama.ConsumerMessage) ingest.Record {
	var hs []outbox.Header
	if len(m.Headers) > 0 {
		hs = make([]outbox.Header, 0, len(m.Headers))
		for _, h := range m.Headers {
			if h != nil {
				hs = append(hs, outbox.Header{Key: string(h.Key), Value: h.Value})
			}
		}
	}
	return ingest.Record{
		Kind: ingest.RecordItem, Partition: s.feedPart, Topic: s.topic, Epoch: epoch, Position: m.Offset + 1,
		Item: ingest.Item{Key: m.Key, Value: m.Value, Headers: hs},
	}
}
