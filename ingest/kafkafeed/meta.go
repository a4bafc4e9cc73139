package kafkafeed

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/kafkasec"
)

// kafkaMinCheckGap spaces the metadata requests that confirm records, so a
// busy feed sends at most one per gap (and each covers every record that
// arrived before it).
const kafkaMinCheckGap = 5 * time.Millisecond

// topicMeta is what a metadata request says of a topic.
type topicMeta struct {
	exists     bool
	id         string
	partitions int32
}

// manage runs the metadata checks: every MetadataRefresh, and on request
// (records to confirm, a consumer that ended).
func (f *Feed) manage() {
	defer f.wg.Done()
	t := time.NewTicker(f.cfg.MetadataRefresh)
	defer t.Stop()
	var last time.Time
	failing := false
	for {
		tick := false
		select {
		case <-f.done:
			return
		case <-t.C:
			tick = true
		case <-f.checkReq:
			if gap := kafkaMinCheckGap - time.Since(last); gap > 0 {
				select {
				case <-f.done:
					return
				case <-time.After(gap):
				}
			}
		}
		last = time.Now()
		err := f.check()
		if f.ctx.Err() != nil {
			return
		}
		failing = f.checked(err, failing)
		if tick && !failing {
			f.refreshEnds()
			f.probeTails()
		}
	}
}

// checked logs the outcome of a metadata check: a failure when the checks
// start failing, a refusal (kafkasec.Refused) when it is new, a success
// after failures. It returns whether the check failed.
func (f *Feed) checked(err error, failing bool) bool {
	changed, refused := f.troubles.set(troubleMetadata, err)
	switch {
	case changed:
		f.log.Error("Kafka refused the feed its topics: nothing is read until an operator grants it", logErr, err)
	case refused:
	case err != nil && !failing:
		f.log.Warn("reading topic metadata (will retry)", logErr, err)
	case err == nil && failing:
		f.log.Info("topic metadata read again")
	}
	return err != nil
}

// check reads the topics' metadata, starts consumers for partitions not yet
// read (new ones, re-created topics, ended consumers), and confirms the
// records and the ends seen before it started.
func (f *Feed) check() error {
	started := time.Now()
	seen := f.seenEnds()
	md, err := f.metadata()
	if err != nil {
		return err
	}
	var errs []error
	for ti, topic := range f.topics {
		if err := f.reconcile(ti, md[topic], started, seen); err != nil {
			errs = append(errs, err)
		}
	}
	signal(f.ready)
	return errors.Join(errs...)
}

// seenEnd is a partition's end as seen before a metadata request, in the
// epoch it was seen in.
type seenEnd struct {
	epoch string
	end   int64
}

// seenEnds takes each partition's end as seen now, for the metadata
// request about to be sent to confirm.
func (f *Feed) seenEnds() map[int32]seenEnd {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[int32]seenEnd, len(f.slots))
	for p, s := range f.slots {
		if s.epoch != "" {
			m[p] = seenEnd{s.epoch, s.seen}
		}
	}
	return m
}

// metadata asks a broker about the feed's topics.
func (f *Feed) metadata() (map[string]topicMeta, error) {
	b := f.client.LeastLoadedBroker()
	if b == nil {
		return nil, errors.New("metadata: no broker")
	}
	req := sarama.NewMetadataRequest(sarama.V3_6_0_0, f.topics) // v11: topic IDs
	req.AllowAutoTopicCreation = false
	resp, err := b.GetMetadata(req)
	if err != nil {
		_ = b.Close() // dialled again on next use
		return nil, fmt.Errorf("metadata of %v: %w", f.topics, err)
	}
	md := make(map[string]topicMeta, len(resp.Topics))
	for _, t := range resp.Topics {
		switch {
		case errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition):
			md[t.Name] = topicMeta{}
		case !errors.Is(t.Err, sarama.ErrNoError):
			// Reading a topic needs Read on it, which implies the
			// Describe a metadata request needs.
			return nil, kafkasec.Denied(fmt.Errorf("metadata of %s: %w", t.Name, t.Err), f.cfg.Kafka.Principal(),
				kafkasec.Ask{Op: "Read", Resource: kafkasec.ResourceTopic, Name: t.Name})
		default:
			md[t.Name] = topicMeta{exists: true, id: t.Uuid.String(), partitions: int32(len(t.Partitions))}
		}
	}
	for _, topic := range f.topics {
		if _, ok := md[topic]; !ok {
			return nil, fmt.Errorf("metadata: no answer for %s", topic)
		}
	}
	return md, nil
}

// reconcile brings topic ti's partitions in line with its metadata, then
// confirms its records that arrived before started and the ends in seen.
func (f *Feed) reconcile(ti int, tm topicMeta, started time.Time, seen map[int32]seenEnd) error {
	topic := f.topics[ti]
	if !tm.exists {
		// Nothing read before started can be from a later incarnation
		// this request would have shown.
		f.confirm(ti, "", started, seen)
		return nil
	}
	var errs []error
	f.mu.Lock()
	replaced := f.ids[topic] != "" && f.ids[topic] != tm.id
	f.ids[topic] = tm.id
	f.mu.Unlock()
	if replaced {
		f.log.Warn("topic re-created: reading its new incarnation from the start", logTopic, topic, "id", tm.id)
	}
	for kp := int32(0); kp < tm.partitions; kp++ {
		if err := f.ensureRun(ti, kp, Epoch(tm.id, kp)); err != nil {
			errs = append(errs, err)
		}
	}
	f.retireBeyond(ti, tm)
	f.confirm(ti, tm.id, started, seen)
	return errors.Join(errs...)
}

// confirm marks the records of topic ti that arrived before started as
// confirmed, unless a later request already did, and makes the ends in seen
// the confirmed ends of the partitions still read in the epoch they were
// seen in: of the topic with ID id, or of any ID when id is "" (the topic
// no longer exists, so what was seen was the incarnation read).
func (f *Feed) confirm(ti int, id string, started time.Time, seen map[int32]seenEnd) {
	f.mu.Lock()
	defer f.mu.Unlock()
	topic := f.topics[ti]
	if started.After(f.verified[topic]) {
		f.verified[topic] = started
	}
	for _, s := range f.order {
		se, ok := seen[s.feedPart]
		if s.ti != ti || !ok || se.epoch != s.epoch || (id != "" && se.epoch != Epoch(id, s.part)) {
			continue
		}
		// A consumer started by this request has its end from its own
		// start, which is newer than what was seen before.
		if s.run == nil || s.run.since.Before(started) {
			s.end = se.end
		}
	}
}

// ensureRun makes sure partition kp of topic ti is read in epoch: it stops
// a consumer of another epoch, and starts one where none runs.
func (f *Feed) ensureRun(ti int, kp int32, epoch string) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	s := f.slot(ti, kp)
	old := s.run
	if old != nil && old.epoch == epoch && !old.ended {
		f.mu.Unlock()
		return nil
	}
	s.run = nil
	if s.epoch != "" && s.epoch != epoch {
		// Records not confirmed before the topic was re-created may be
		// the new incarnation's, read at the old one's offsets: the new
		// epoch's start settles it.
		s.doubt = append(s.doubt, s.dropUnverified(f.verified[s.topic])...)
		if n := len(s.doubt); n > 0 {
			f.slotLog(s).Warn("records read but not confirmed before the topic was re-created: comparing them with the new incarnation",
				"records", n)
		}
	}
	f.mu.Unlock()
	if old != nil {
		old.stop()
	}
	return f.startSlot(s, epoch)
}

// startSlot positions s for epoch (queueing the loss and epoch records that
// explain where it starts) and starts its consumer.
func (f *Feed) startSlot(s *kafkaSlot, epoch string) error {
	read := kafkasec.Ask{Op: "Read", Resource: kafkasec.ResourceTopic, Name: s.topic}
	if err := f.client.RefreshMetadata(s.topic); err != nil {
		return kafkasec.Denied(fmt.Errorf("start %s[%d]: %w", s.topic, s.part, err), f.cfg.Kafka.Principal(), read)
	}
	oldest, err := f.client.GetOffset(s.topic, s.part, sarama.OffsetOldest)
	if err != nil {
		return kafkasec.Denied(fmt.Errorf("log start of %s[%d]: %w", s.topic, s.part, err), f.cfg.Kafka.Principal(), read)
	}
	newest, err := f.client.GetOffset(s.topic, s.part, sarama.OffsetNewest)
	if err != nil {
		return kafkasec.Denied(fmt.Errorf("high watermark of %s[%d]: %w", s.topic, s.part, err), f.cfg.Kafka.Principal(), read)
	}
	f.mu.Lock()
	doubt := s.doubt
	f.mu.Unlock()
	oldEnd := f.doubtEnd(s, doubt, oldest, newest)
	f.mu.Lock()
	from := f.position(s, epoch, oldest, newest, oldEnd)
	f.mu.Unlock()
	signal(f.ready)
	err = f.startRun(s, epoch, from)
	if errors.Is(err, errFeedClosed) {
		return nil
	}
	return err
}

// position decides where s is read from in epoch, given the partition's
// log start and high watermark, and queues the records that say why. For a
// new epoch, oldEnd is the position after the last record of the old one
// that was read but is not kept (see doubtEnd), 0 if none. f.mu is held.
func (f *Feed) position(s *kafkaSlot, epoch string, oldest, newest, oldEnd int64) int64 {
	if s.epoch != epoch {
		// What the old epoch held past the records kept was never
		// applied: up to its confirmed end, and to its last record read
		// and dropped. Nothing else of it is known.
		if end := max(s.end, oldEnd); s.epoch != "" && end > s.next {
			f.lose(s, LossTopicReplaced, s.next, end)
		}
		s.doubt = nil
		s.epoch = epoch
		s.queue(ingest.Record{Kind: ingest.RecordEpoch, Epoch: epoch, Position: oldest})
		s.end, s.seen = newest, newest
		f.slotLog(s).Info("kafka feed epoch", logEpoch, epoch, logFrom, oldest)
		return oldest
	}
	s.end, s.seen = max(s.end, newest), max(s.seen, newest)
	switch {
	case s.next < oldest:
		f.lose(s, LossRetention, s.next, oldest)
	case s.next > newest:
		// The log lost its tail (an unclean leader election): what is
		// written again at those offsets the loop skips as replays.
		f.slotLog(s).Error("stored position past the high watermark: reading on from it",
			"position", s.next, "high_watermark", newest)
		s.next = newest
	}
	return s.next
}

// lose queues a loss of s's current epoch.
func (f *Feed) lose(s *kafkaSlot, reason string, from, to int64) {
	s.queue(ingest.Record{Kind: ingest.RecordLoss, Epoch: s.epoch, From: from, To: to, Reason: reason})
	f.slotLog(s).Warn("kafka feed lost input", logEpoch, s.epoch, logFrom, from, logTo, to, "reason", reason)
}

// retireBeyond stops reading partitions of topic ti that its metadata no
// longer has (a topic re-created with fewer partitions), recording what was
// not read of them as lost. Their records not yet confirmed are the old
// incarnation's: the new one has no such partition.
func (f *Feed) retireBeyond(ti int, tm topicMeta) {
	var stop []*kafkaRun
	f.mu.Lock()
	for _, s := range f.order {
		if s.ti != ti || s.part < tm.partitions {
			continue
		}
		end := s.end
		if s.run != nil {
			stop = append(stop, s.run)
			s.run = nil
			if dropped := s.dropUnverified(f.verified[s.topic]); len(dropped) > 0 {
				end = max(end, recordEnd(dropped[len(dropped)-1].rec))
			}
		}
		if s.epoch != "" && end > s.next {
			f.lose(s, LossTopicReplaced, s.next, end)
		}
		s.end, s.seen = s.next, s.next
	}
	f.mu.Unlock()
	for _, r := range stop {
		r.stop()
	}
}
