package kafkafeed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox"
)

// kafkaFlushTimeout bounds the last commit of the group's offsets on Close.
const kafkaFlushTimeout = 5 * time.Second

// Commit records through as the group's offsets: each checkpoint's position
// (the offset to read next) for its partition, when its epoch is the one
// read now. They are sent in the background at most every CommitInterval,
// and on Close, so a slow or absent group coordinator never holds the loop
// up. It returns nil; failures to send are logged and retried. Without a
// Group it does nothing.
func (f *Feed) Commit(_ context.Context, through []outbox.Checkpoint) error {
	if f.cfg.Group == "" || f.commits == nil {
		return nil
	}
	f.mu.Lock()
	var offs []kafkaOffset
	for _, cp := range through {
		s, ok := f.slots[cp.Partition]
		if ok && s.epoch == cp.Epoch {
			offs = append(offs, kafkaOffset{topic: s.topic, part: s.part, offset: cp.Position})
		}
	}
	f.mu.Unlock()
	f.commits.mark(offs)
	return nil
}

type kafkaOffset struct {
	topic  string
	part   int32
	offset int64
}

type topicPart struct {
	topic string
	part  int32
}

// kafkaCommitter sends the offsets marked to the group coordinator, the
// way a consumer outside any group generation does (generation -1, no
// member): the group holds offsets only, for Kafka's lag tools.
type kafkaCommitter struct {
	f         *Feed
	wake      chan struct{}
	sendMu    sync.Mutex // one OffsetCommit at a time, so an older one never lands last
	mu        sync.Mutex
	dirty     map[topicPart]int64
	failed    bool      // the last send failed (logged once until it works again)
	holdUntil time.Time // no send before, after a refusal
}

func newKafkaCommitter(f *Feed) *kafkaCommitter {
	return &kafkaCommitter{f: f, wake: make(chan struct{}, 1), dirty: map[topicPart]int64{}}
}

func (c *kafkaCommitter) mark(offs []kafkaOffset) {
	if len(offs) == 0 {
		return
	}
	c.mu.Lock()
	for _, o := range offs {
		c.dirty[topicPart{o.topic, o.part}] = o.offset
	}
	c.mu.Unlock()
	signal(c.wake)
}

// run sends marked offsets, at most every CommitInterval, until Close.
func (c *kafkaCommitter) run() {
	defer c.f.wg.Done()
	if c.f.cfg.Group == "" {
		return
	}
	for {
		select {
		case <-c.f.done:
			return
		case <-c.wake:
		}
		if d := c.hold(); d > 0 && clock.Sleep(c.f.ctx, d) != nil {
			return
		}
		c.send()
		if clock.Sleep(c.f.ctx, c.f.cfg.CommitInterval) != nil {
			return
		}
	}
}

// flush sends what is marked, bounded by kafkaFlushTimeout.
func (c *kafkaCommitter) flush() {
	if c.f.cfg.Group == "" {
		return
	}
	done := make(chan struct{})
	go func() { defer close(done); c.send() }()
	select {
	case <-done:
	case <-time.After(kafkaFlushTimeout):
		c.f.log.Warn("committing the group's offsets timed out on close", "group", c.f.cfg.Group)
	}
}

// send commits the marked offsets; those that fail stay marked unless newer
// ones replaced them.
func (c *kafkaCommitter) send() {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	batch := c.dirty
	c.dirty = map[topicPart]int64{}
	c.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	failed, err := c.commit(batch)
	c.mu.Lock()
	for tp, off := range failed {
		if _, newer := c.dirty[tp]; !newer {
			c.dirty[tp] = off
		}
	}
	wasFailing := c.failed
	c.failed = err != nil
	c.mu.Unlock()
	changed, refused := c.f.troubles.set(troubleGroup, err)
	switch {
	case changed:
		c.f.log.Error("Kafka refused the feed its group's offsets: the feed reads on (the store's positions are the "+
			"authority), Kafka's lag tools see no progress until an operator grants it", "group", c.f.cfg.Group, logErr, err)
	case refused:
	case err != nil && !wasFailing:
		c.f.log.Warn("committing the group's offsets (will retry; the store's positions stand)", "group", c.f.cfg.Group, logErr, err)
	case err == nil && wasFailing:
		c.f.log.Info("committing the group's offsets works again", "group", c.f.cfg.Group)
	}
	if refused {
		c.mu.Lock()
		c.holdUntil = time.Now().Add(c.f.cfg.RefusedRetry)
		c.mu.Unlock()
	}
	if err != nil {
		signal(c.wake)
	}
}

// hold is how long to wait before the next send: after a refusal, only an
// operator helps, so the group is asked again only every RefusedRetry.
func (c *kafkaCommitter) hold() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Until(c.holdUntil)
}

// commit sends one OffsetCommit and returns the offsets that failed.
func (c *kafkaCommitter) commit(batch map[topicPart]int64) (map[topicPart]int64, error) {
	group := c.f.cfg.Group
	// Committing needs Read on the group (which implies the Describe that
	// finding its coordinator needs) and on each topic.
	readGroup := kafkasec.Ask{Op: "Read", Resource: kafkasec.ResourceGroup, Name: group}
	principal := c.f.cfg.Kafka.Principal()
	b, err := c.f.client.Coordinator(group)
	if err != nil {
		return batch, kafkasec.Denied(fmt.Errorf("coordinator of %s: %w", group, err), principal, readGroup)
	}
	// Version 8, as sarama's offset manager sends to Kafka 2.4 and later.
	req := &sarama.OffsetCommitRequest{Version: 8, ConsumerGroup: group, ConsumerGroupGeneration: -1}
	for tp, off := range batch {
		req.AddBlockWithLeaderEpoch(tp.topic, tp.part, off, -1, 0, "")
	}
	resp, err := b.CommitOffset(req)
	if err != nil {
		_ = c.f.client.RefreshCoordinator(group)
		return batch, kafkasec.Denied(fmt.Errorf("commit offsets of %s: %w", group, err), principal, readGroup)
	}
	failed := map[topicPart]int64{}
	var errs []error
	for tp, off := range batch {
		kerr, ok := resp.Errors[tp.topic][tp.part]
		if ok && errors.Is(kerr, sarama.ErrNoError) {
			continue
		}
		failed[tp] = off
		if !ok {
			errs = append(errs, fmt.Errorf("%s[%d]: %w", tp.topic, tp.part, sarama.ErrIncompleteResponse))
			continue
		}
		if errors.Is(kerr, sarama.ErrNotCoordinatorForConsumer) || errors.Is(kerr, sarama.ErrConsumerCoordinatorNotAvailable) {
			_ = c.f.client.RefreshCoordinator(group)
		}
		errs = append(errs, kafkasec.Denied(fmt.Errorf("%s[%d]: %w", tp.topic, tp.part, kerr), principal, readGroup,
			kafkasec.Ask{Op: "Read", Resource: kafkasec.ResourceTopic, Name: tp.topic}))
	}
	return failed, firstRefusal(errs)
}

// firstRefusal is the first refusal of errs, alone, so a refused group
// reads as one refusal and not one per partition; else errs joined.
func firstRefusal(errs []error) error {
	for _, err := range errs {
		if kafkasec.Refused(err) {
			return err
		}
	}
	return errors.Join(errs...)
}
