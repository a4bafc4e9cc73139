package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/clock"
)

// Consumer fetch sizes and wait: a broker answers a fetch as soon as one
// of its partitions has a record, or after consumeMaxWait.
const (
	consumeMaxWait        = 500 // milliseconds
	consumeMaxBytes       = 16 << 20
	consumePartitionBytes = 8 << 20
)

// Consume backoff after a failure a retry mends, doubled up to its cap.
const (
	consumeBackoff    = 100 * time.Millisecond
	consumeBackoffCap = time.Second
)

// Consume reads every partition of topic from its log start at level and
// hands each record to each, with its partition and the time its fetch
// arrived, on Consume's goroutine, in offset order within a partition.
// Transaction markers are left out; under sarama.ReadCommitted the records
// of aborted transactions and those past the last stable offset are too,
// as a read_committed consumer leaves them out. The partitions a broker
// leads are fetched in one request, so a record on one of them does not
// wait on the others; the next fetch is under way while each runs.
//
// Consume runs until ctx is done, then returns nil, or until a fetch fails
// in a way no retry mends (an authorization failure, say), then returns
// that error. A leader that moves, a broker away, a topic not yet
// described are waited out. A partition whose records were deleted under
// it is read again from its new log start. No goroutine outlives the call.
func (c *Client) Consume(ctx context.Context, topic string, level sarama.IsolationLevel,
	each func(partition int32, r *Record, at time.Time)) error {
	ctx, cancel := context.WithCancel(ctx)
	got := make(chan fetchedAt, 4)
	fatal := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.consumeRounds(ctx, topic, level, got); err != nil {
			fatal <- err
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-fatal:
			return fmt.Errorf("consume %s: %w", topic, err)
		case f := <-got:
			for i := range f.Records {
				if !f.Records[i].Control {
					each(f.partition, &f.Records[i], f.at)
				}
			}
		}
	}
}

// fetchedAt is one partition's part of a fetch, and when it arrived.
type fetchedAt struct {
	Fetched
	partition int32
	at        time.Time
}

// consumeRounds fetches topic in rounds, one per metadata: each round
// fetches every leader's partitions until one of them fails in a way a
// retry mends, then the round ends, the metadata is asked again and the
// next round resumes from the offsets reached. It returns nil when ctx is
// done, or the first error no retry mends.
func (c *Client) consumeRounds(ctx context.Context, topic string, level sarama.IsolationLevel, got chan<- fetchedAt) error {
	offsets := map[int32]int64{} // the next offset of each partition; absent: its log start
	backoff := consumeBackoff
	for ctx.Err() == nil {
		err := c.consumeRound(ctx, topic, level, offsets, got)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			backoff = consumeBackoff
			continue
		case !consumeRetriable(err):
			return err
		}
		if clock.Sleep(ctx, backoff) != nil {
			return nil
		}
		backoff = min(2*backoff, consumeBackoffCap)
	}
	return nil
}

// consumeRound is one round of consumeRounds: it fetches each leader's
// partitions on a goroutine of its own, and keeps the offsets they reach
// in offsets.
func (c *Client) consumeRound(ctx context.Context, topic string, level sarama.IsolationLevel,
	offsets map[int32]int64, got chan<- fetchedAt) error {
	byLeader, err := c.leaders(ctx, topic)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for leader, parts := range byLeader {
		own := make(map[int32]int64, len(parts))
		for _, p := range parts {
			if o, ok := offsets[p]; ok {
				own[p] = o
			} else {
				own[p] = Earliest
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.fetchLeader(ctx, topic, leader, level, own, got)
			mu.Lock()
			defer mu.Unlock()
			for p, o := range own {
				offsets[p] = o
			}
			if err != nil && first == nil {
				first = err
				cancel() // the round ends: the metadata is asked again
			}
		}()
	}
	wg.Wait()
	return first
}

// leaders returns topic's partitions by their leader, or a retriable
// error while the topic or a partition's leader is not known.
func (c *Client) leaders(ctx context.Context, topic string) (map[int32][]int32, error) {
	m, err := c.Metadata(ctx, []string{topic}, false)
	if err != nil {
		return nil, err
	}
	t, ok := m[topic]
	switch {
	case !ok:
		return nil, fmt.Errorf("metadata of %s: %w", topic, sarama.ErrUnknownTopicOrPartition)
	case t.Err != sarama.ErrNoError:
		return nil, fmt.Errorf("metadata of %s: %w", topic, t.Err)
	case len(t.Partitions) == 0:
		return nil, fmt.Errorf("metadata of %s: no partition: %w", topic, sarama.ErrLeaderNotAvailable)
	}
	by := map[int32][]int32{}
	for _, p := range t.Partitions {
		if p.Leader < 0 {
			return nil, fmt.Errorf("%s[%d]: %w", topic, p.ID, sarama.ErrLeaderNotAvailable)
		}
		by[p.Leader] = append(by[p.Leader], p.ID)
	}
	return by, nil
}

// fetchLeader fetches offsets' partitions from their leader, one request
// for all of them at a time, sending what each returned on got and
// moving its offset on, until ctx is done (nil) or a fetch fails. An
// offset at Earliest is first asked of the leader.
func (c *Client) fetchLeader(ctx context.Context, topic string, leader int32, level sarama.IsolationLevel,
	offsets map[int32]int64, got chan<- fetchedAt) error {
	b, err := c.broker(ctx, leader, topic)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		for p, o := range offsets {
			if o == Earliest {
				start, err := c.ListOffset(ctx, topic, p, leader, Earliest, level)
				if err != nil {
					return fmt.Errorf("log start of %s[%d]: %w", topic, p, err)
				}
				offsets[p] = start
			}
		}
		parts, err := c.fetchMany(ctx, b, topic, offsets, level)
		if err != nil {
			return err
		}
		at := time.Now()
		for p, f := range parts {
			if f.err == sarama.ErrOffsetOutOfRange {
				offsets[p] = Earliest // deleted under the consumer: read on from the new start
				continue
			}
			if f.err != sarama.ErrNoError {
				return fmt.Errorf("fetch %s[%d]: %w", topic, p, f.err)
			}
			if len(f.Records) > 0 {
				select {
				case got <- fetchedAt{Fetched: f.Fetched, partition: p, at: at}:
				case <-ctx.Done():
					return nil // the offset stays: the next round fetches these again
				}
			}
			offsets[p] = f.Next
		}
	}
	return nil
}

// partFetch is a partition's answer to fetchMany.
type partFetch struct {
	Fetched
	err sarama.KError
}

// fetchMany reads offsets' partitions of topic from b, each from its
// offset, in one request at level.
func (c *Client) fetchMany(ctx context.Context, b *sarama.Broker, topic string, offsets map[int32]int64,
	level sarama.IsolationLevel) (map[int32]partFetch, error) {
	req := &sarama.FetchRequest{Version: fetchVersion, MaxWaitTime: consumeMaxWait, MinBytes: 1,
		MaxBytes: consumeMaxBytes, Isolation: level, SessionID: 0, SessionEpoch: -1}
	for p, o := range offsets {
		req.AddBlock(topic, p, o, consumePartitionBytes, -1)
	}
	var resp *sarama.FetchResponse
	if err := c.do(ctx, b, func(b *sarama.Broker) (err error) {
		resp, err = b.Fetch(req)
		return err
	}); err != nil {
		return nil, err
	}
	if resp.ErrorCode != 0 {
		return nil, sarama.KError(resp.ErrorCode)
	}
	out := make(map[int32]partFetch, len(offsets))
	for p, o := range offsets {
		blk := resp.GetBlock(topic, p)
		switch {
		case blk == nil:
			return nil, fmt.Errorf("the fetch response does not name %s[%d]", topic, p)
		case blk.Err != sarama.ErrNoError:
			out[p] = partFetch{Fetched: Fetched{Next: o}, err: blk.Err}
		default:
			out[p] = partFetch{Fetched: fetched(blk, o, level)}
		}
	}
	return out, nil
}

// consumeRetriable reports a failure of a fetch that asking the metadata
// again and retrying mends: the connection failed, the broker is not in
// the metadata, or a retriable code (IsRetriable) but CORRUPT_MESSAGE,
// which the same fetch would answer again.
func consumeRetriable(err error) bool {
	if isConnectionError(err) || errors.Is(err, sarama.ErrBrokerNotFound) {
		return true
	}
	var code sarama.KError
	return errors.As(err, &code) && code != sarama.ErrInvalidMessage && IsRetriable(code)
}
