package kafka

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/IBM/sarama"
)

// Topic is a topic as metadata describes it.
type Topic struct {
	Name     string
	Internal bool
	// Err is the topic's error code: ErrUnknownTopicOrPartition for a
	// topic that does not exist, an authorization failure for one the
	// principal may not describe.
	Err        sarama.KError
	ID         sarama.Uuid
	Partitions []Partition
	// AuthorizedOps is the bit set of the ACL operations (by
	// sarama.AclOperation) the principal has on the topic, when
	// KnowsOps is set (Kafka 2.3 and later, when asked).
	AuthorizedOps int32
	KnowsOps      bool
}

// Partition is a partition as metadata describes it.
type Partition struct {
	ID     int32
	Leader int32 // -1: none
	Err    sarama.KError
}

// Metadata describes topics straight from a broker (no cache: a topic
// created a moment ago is found; no topic: every topic); authorizedOps asks for the principal's
// operations on each. A topic the response does not name is missing from
// the map.
func (c *Client) Metadata(ctx context.Context, topics []string, authorizedOps bool) (map[string]Topic, error) {
	var resp *sarama.MetadataResponse
	err := c.any(ctx, func(b *sarama.Broker) (err error) {
		resp, err = c.metadata(b, topics, authorizedOps)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	m := make(map[string]Topic, len(resp.Topics))
	for _, t := range resp.Topics {
		td := Topic{Name: t.Name, Internal: t.IsInternal, Err: t.Err, ID: t.Uuid}
		// Kafka sends INT32_MIN when it was not asked or cannot say.
		if authorizedOps && t.TopicAuthorizedOperations != math.MinInt32 {
			td.AuthorizedOps, td.KnowsOps = t.TopicAuthorizedOperations, true
		}
		for _, p := range t.Partitions {
			td.Partitions = append(td.Partitions, Partition{ID: p.ID, Leader: p.Leader, Err: p.Err})
		}
		m[t.Name] = td
	}
	return m, nil
}

// metadata sends one metadata request to b and learns the brokers it names.
func (c *Client) metadata(b *sarama.Broker, topics []string, authorizedOps bool) (*sarama.MetadataResponse, error) {
	req := &sarama.MetadataRequest{Version: metadataVersion, Topics: topics, IncludeTopicAuthorizedOperations: authorizedOps}
	resp, err := b.GetMetadata(req)
	if err != nil {
		return nil, err
	}
	c.learn(resp)
	return resp, nil
}

// Topics lists the cluster's topics (metadata of every topic).
func (c *Client) Topics(ctx context.Context) (map[string]Topic, error) {
	return c.Metadata(ctx, nil, false)
}

// Offset times: the start of the log, its end.
const (
	Earliest = sarama.OffsetOldest
	Latest   = sarama.OffsetNewest
)

// ListOffset asks a partition's leader for an offset: at Earliest the log
// start; at Latest the high watermark under sarama.ReadUncommitted, the
// last stable offset under sarama.ReadCommitted.
func (c *Client) ListOffset(ctx context.Context, topic string, partition, leader int32, at int64,
	level sarama.IsolationLevel) (int64, error) {
	b, err := c.broker(ctx, leader, topic)
	if err != nil {
		return 0, err
	}
	req := &sarama.OffsetRequest{Version: listOffsetsVersion, IsolationLevel: level}
	req.AddBlock(topic, partition, at, 1)
	var resp *sarama.OffsetResponse
	if err := c.do(ctx, b, func(b *sarama.Broker) (err error) {
		resp, err = b.GetAvailableOffsets(req)
		return err
	}); err != nil {
		return 0, err
	}
	blk := resp.GetBlock(topic, partition)
	switch {
	case blk == nil:
		return 0, sarama.ErrUnknownTopicOrPartition
	case blk.Err != sarama.ErrNoError:
		return 0, blk.Err
	}
	return blk.Offset, nil
}

// Record is a record of a fetch, control records included.
type Record struct {
	Offset        int64
	Timestamp     time.Time
	Key, Value    []byte
	Headers       []*sarama.RecordHeader
	Control       bool // a transaction marker; Key holds its type
	Transactional bool
	ProducerID    int64
}

// Fetched is what one fetch of a partition returned.
type Fetched struct {
	Records []Record
	// Next is the offset to fetch next: past every whole batch returned,
	// aborted batches and transaction markers included; the offset asked
	// for when none was.
	Next int64
	// HighWatermark and LastStable are the partition's, as the leader
	// answered.
	HighWatermark, LastStable int64
}

// Fetch reads one partition from offset on its leader, at level. Under
// sarama.ReadCommitted the batches of aborted transactions are left out,
// as a read_committed consumer leaves them out; markers are kept at both
// levels.
func (c *Client) Fetch(ctx context.Context, topic string, partition, leader int32, offset int64,
	level sarama.IsolationLevel) (Fetched, error) {
	b, err := c.broker(ctx, leader, topic)
	if err != nil {
		return Fetched{}, err
	}
	req := &sarama.FetchRequest{Version: fetchVersion, MaxWaitTime: 200, MinBytes: 1, MaxBytes: 16 << 20,
		Isolation: level, SessionID: 0, SessionEpoch: -1}
	req.AddBlock(topic, partition, offset, 8<<20, -1)
	var resp *sarama.FetchResponse
	if err := c.do(ctx, b, func(b *sarama.Broker) (err error) {
		resp, err = b.Fetch(req)
		return err
	}); err != nil {
		return Fetched{}, err
	}
	if resp.ErrorCode != 0 {
		return Fetched{}, sarama.KError(resp.ErrorCode)
	}
	blk := resp.GetBlock(topic, partition)
	switch {
	case blk == nil:
		return Fetched{}, fmt.Errorf("the fetch response does not name %s[%d]", topic, partition)
	case blk.Err != sarama.ErrNoError:
		return Fetched{}, blk.Err
	}
	return fetched(blk, offset, level), nil
}

// fetched is what blk, the answer for a partition fetched from offset at
// level, returned.
func fetched(blk *sarama.FetchResponseBlock, offset int64, level sarama.IsolationLevel) Fetched {
	f := Fetched{Next: offset, HighWatermark: blk.HighWaterMarkOffset, LastStable: blk.LastStableOffset}
	ab := aborts{}
	if level == sarama.ReadCommitted {
		ab = newAborts(blk.AbortedTransactions)
	}
	for _, rs := range blk.RecordsSet {
		rb := rs.RecordBatch
		if rb == nil || rb.PartialTrailingRecord {
			continue // a legacy message set (no transactions) or a batch cut short
		}
		end := rb.FirstOffset + int64(rb.LastOffsetDelta) + 1
		if end <= f.Next {
			continue
		}
		if !ab.skip(rb) {
			for _, r := range rb.Records {
				if o := rb.FirstOffset + r.OffsetDelta; o >= offset {
					ts := rb.FirstTimestamp.Add(r.TimestampDelta)
					if rb.LogAppendTime {
						ts = rb.MaxTimestamp
					}
					f.Records = append(f.Records, Record{Offset: o, Timestamp: ts, Key: r.Key, Value: r.Value,
						Headers: r.Headers, Control: rb.Control, Transactional: rb.IsTransactional, ProducerID: rb.ProducerID})
				}
			}
		}
		f.Next = end
	}
	return f
}

// aborts follows a read_committed fetch's aborted transactions through
// its batches, as the Java consumer does.
type aborts struct {
	queue []*sarama.AbortedTransaction // by first offset, not yet begun
	open  map[int64]bool               // producers inside an aborted transaction
}

func newAborts(list []*sarama.AbortedTransaction) aborts {
	q := append([]*sarama.AbortedTransaction(nil), list...)
	for i := 1; i < len(q); i++ { // insertion sort: a handful of entries
		for j := i; j > 0 && q[j].FirstOffset < q[j-1].FirstOffset; j-- {
			q[j], q[j-1] = q[j-1], q[j]
		}
	}
	return aborts{queue: q, open: map[int64]bool{}}
}

// skip reports whether rb belongs to an aborted transaction (its marker
// is kept: it ends the abort).
func (a *aborts) skip(rb *sarama.RecordBatch) bool {
	if a.open == nil || !rb.IsTransactional {
		return false
	}
	last := rb.FirstOffset + int64(rb.LastOffsetDelta)
	for len(a.queue) > 0 && a.queue[0].FirstOffset <= last {
		a.open[a.queue[0].ProducerID] = true
		a.queue = a.queue[1:]
	}
	if rb.Control {
		delete(a.open, rb.ProducerID)
		return false
	}
	return a.open[rb.ProducerID]
}

// TopicSpec is how CreateTopics makes a topic.
type TopicSpec struct {
	Partitions  int32
	Replication int16 // -1: the broker's default
	Configs     map[string]*string
}

// TopicResult is a created topic's answer: Err is ErrNoError, or the
// refusal (ErrTopicAlreadyExists among them) with Message.
type TopicResult struct {
	Err     sarama.KError
	Message string
}

// createTimeout is how long the controller may take to create topics.
const createTimeout = 15 * time.Second

// CreateTopics asks the controller to create topics, every one with spec,
// and returns each topic's answer.
func (c *Client) CreateTopics(ctx context.Context, spec TopicSpec, topics ...string) (map[string]TopicResult, error) {
	if len(topics) == 0 {
		return map[string]TopicResult{}, nil
	}
	ctrl, err := c.controller(ctx, topics)
	if err != nil {
		return nil, err
	}
	req := &sarama.CreateTopicsRequest{Version: createTopicsVersion, Timeout: createTimeout,
		TopicDetails: map[string]*sarama.TopicDetail{}}
	for _, t := range topics {
		req.TopicDetails[t] = &sarama.TopicDetail{NumPartitions: spec.Partitions, ReplicationFactor: spec.Replication,
			ConfigEntries: spec.Configs}
	}
	var resp *sarama.CreateTopicsResponse
	if err := c.do(ctx, ctrl, func(b *sarama.Broker) (err error) {
		resp, err = b.CreateTopics(req)
		return err
	}); err != nil {
		return nil, err
	}
	out := make(map[string]TopicResult, len(resp.TopicErrors))
	for t, te := range resp.TopicErrors {
		r := TopicResult{Err: te.Err}
		if te.ErrMsg != nil {
			r.Message = *te.ErrMsg
		}
		out[t] = r
	}
	return out, nil
}

// controller returns the cluster's controller, from fresh metadata of
// topics.
func (c *Client) controller(ctx context.Context, topics []string) (*sarama.Broker, error) {
	var id int32
	if err := c.any(ctx, func(b *sarama.Broker) error {
		resp, err := c.metadata(b, topics, false)
		if err == nil {
			id = resp.ControllerID
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	if id < 0 {
		return nil, sarama.ErrControllerNotAvailable
	}
	return c.broker(ctx, id, topics[0])
}

// TopicConfigs returns the settings of topic as a broker describes them
// (the sensitive ones without their values).
func (c *Client) TopicConfigs(ctx context.Context, topic string) (map[string]string, error) {
	req := &sarama.DescribeConfigsRequest{Version: describeConfigsVersion,
		Resources: []*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic}}}
	var resp *sarama.DescribeConfigsResponse
	if err := c.any(ctx, func(b *sarama.Broker) (err error) {
		resp, err = b.DescribeConfigs(req)
		return err
	}); err != nil {
		return nil, fmt.Errorf("describe configs of %s: %w", topic, err)
	}
	for _, r := range resp.Resources {
		if r.Name != topic {
			continue
		}
		if r.ErrorCode != 0 {
			return nil, fmt.Errorf("describe configs of %s: %w (%s)", topic, sarama.KError(r.ErrorCode), r.ErrorMsg)
		}
		m := make(map[string]string, len(r.Configs))
		for _, e := range r.Configs {
			if !e.Sensitive {
				m[e.Name] = e.Value
			}
		}
		return m, nil
	}
	return nil, fmt.Errorf("describe configs of %s: no answer for it", topic)
}

// CommittedOffsets returns the offsets group committed on topic's
// partitions, asked of the group's coordinator; a partition without one
// is left out, and so is every partition of a group that never committed.
func (c *Client) CommittedOffsets(ctx context.Context, group, topic string, partitions []int32) (map[int32]int64, error) {
	var coord *sarama.FindCoordinatorResponse
	if err := c.any(ctx, func(b *sarama.Broker) (err error) {
		coord, err = b.FindCoordinator(&sarama.FindCoordinatorRequest{Version: 2, CoordinatorKey: group,
			CoordinatorType: sarama.CoordinatorGroup})
		return err
	}); err != nil {
		return nil, fmt.Errorf("coordinator of group %s: %w", group, err)
	}
	if coord.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("coordinator of group %s: %w", group, coord.Err)
	}
	b := coord.Coordinator
	c.mu.Lock()
	if known, ok := c.brokers[b.ID()]; ok && known.Addr() == b.Addr() {
		b = known
	} else {
		c.brokers[b.ID()] = b
	}
	c.mu.Unlock()
	req := &sarama.OffsetFetchRequest{Version: 5, ConsumerGroup: group}
	for _, p := range partitions {
		req.AddPartition(topic, p)
	}
	var resp *sarama.OffsetFetchResponse
	if err := c.do(ctx, b, func(b *sarama.Broker) (err error) {
		resp, err = b.FetchOffset(req)
		return err
	}); err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	switch resp.Err {
	case sarama.ErrNoError:
	case sarama.ErrGroupIDNotFound:
		return map[int32]int64{}, nil
	default:
		return nil, fmt.Errorf("offsets of group %s: %w", group, resp.Err)
	}
	out := map[int32]int64{}
	for _, p := range partitions {
		if blk := resp.GetBlock(topic, p); blk != nil && blk.Err == sarama.ErrNoError && blk.Offset >= 0 {
			out[p] = blk.Offset
		}
	}
	return out, nil
}
