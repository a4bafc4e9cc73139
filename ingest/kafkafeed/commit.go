package kafkafeed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

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
	f      *Feed
	wake   chan struct{}
	sendMu sync.Mutex // one OffsetCommit at a time, so an older one never lands last
	mu     sync.Mutex
	dirty  map[topicPart]int64
	failed bool // the last send failed (logged once until it works again)
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
		c.send()
		if !sleep(c.f.ctx, c.f.cfg.CommitInterval) {
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
	switch {
	case err != nil && !wasFailing:
		c.f.log.Warn("committing the group's offsets (will retry; the store's positions stand)", "group", c.f.cfg.Group, logErr, err)
	case err == nil && wasFailing:
		c.f.log.Info("committing the group's offsets works again", "group", c.f.cfg.Group)
	}
	if err != nil {
		signal(c.wake)
	}
}

// commit sends one OffsetCommit and returns the offsets that failed.
func (c *kafkaCommitter) commit(batch map[topicPart]int64) (map[topicPart]int64, error) {
	group := c.f.cfg.Group
	b, err := c.f.client.Coordinator(group)
	if err != nil {
		return batch, fmt.Errorf("coordinator of %s: %w", group, err)
	}
	// Version 8, as sarama's offset manager sends to Kafka 2.4 and later.
	req := &sarama.OffsetCommitRequest{Version: 8, ConsumerGroup: group, ConsumerGroupGeneration: -1}
	for tp, off := range batch {
		req.AddBlockWithLeaderEpoch(tp.topic, tp.part, off, -1, 0, "")
	}
	resp, err := b.CommitOffset(req)
	if err != nil {
		_ = c.f.client.RefreshCoordinator(group)
		return batch, fmt.Errorf("commit offsets of %s: %w", group, err)
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
		errs = append(errs, fmt.Errorf("%s[%d]: %w", tp.topic, tp.part, kerr))
	}
	return failed, errors.Join(errs...)
}
