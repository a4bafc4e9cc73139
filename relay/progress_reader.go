package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/clock"
)

// The progress topic is read with raw read_committed fetches through
// franz-go rather than a sarama consumer: kgo.ProcessFetchPartition returns
// the next offset past aborted batches and transaction markers, so "read to
// the end" stops exactly at the end even when the log ends in a marker.

// progressPartition is where a relay's progress records live.
type progressPartition struct {
	topic     string
	id        [16]byte
	partition int32
	leader    int32
}

// locateProgress finds the partition holding key's records.
func (k *kafka) locateProgress(ctx context.Context, topic, key string) (progressPartition, error) {
	md, err := k.metadata(ctx, topic)
	if err != nil {
		return progressPartition{}, fmt.Errorf("progress topic %s: metadata: %w", topic, err)
	}
	td, ok := md[topic]
	if !ok {
		return progressPartition{}, fmt.Errorf("progress topic %s: %w", topic, kerr.UnknownTopicOrPartition)
	}
	if err := kerr.ErrorForCode(td.ErrorCode); err != nil {
		return progressPartition{}, k.denied(fmt.Errorf("progress topic %s: %w", topic, err), ask("Describe", ResourceTopic, topic))
	}
	part, err := partitionFor(topic, key, len(td.Partitions))
	if err != nil {
		return progressPartition{}, fmt.Errorf("progress topic %s: partition for %s: %w", topic, key, err)
	}
	for _, pd := range td.Partitions {
		if pd.Partition != part {
			continue
		}
		if err := kerr.ErrorForCode(pd.ErrorCode); err != nil || pd.Leader < 0 {
			return progressPartition{}, fmt.Errorf("progress topic %s[%d]: no leader: %w", topic, part, cmpErr(err, kerr.LeaderNotAvailable))
		}
		return progressPartition{topic: topic, id: td.TopicID, partition: part, leader: pd.Leader}, nil
	}
	return progressPartition{}, fmt.Errorf("progress topic %s[%d]: %w", topic, part, kerr.UnknownTopicOrPartition)
}

func cmpErr(err, fallback error) error {
	if err != nil {
		return err
	}
	return fallback
}

// stableEnd returns the partition's high watermark once every transaction
// that was open below it has ended (last stable offset >= that watermark),
// so a read up to it sees every commit made before the read began.
func (k *kafka) stableEnd(ctx context.Context, pp progressPartition) (int64, error) {
	hwm, err := k.listed(ctx, pp, k.adm.ListEndOffsets)
	if err != nil {
		return 0, fmt.Errorf("progress topic %s[%d]: high watermark: %w", pp.topic, pp.partition, err)
	}
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		lso, err := k.listed(ctx, pp, k.adm.ListCommittedOffsets)
		if err != nil {
			return 0, fmt.Errorf("progress topic %s[%d]: last stable offset: %w", pp.topic, pp.partition, err)
		}
		if lso >= hwm {
			return hwm, nil
		}
		if err := clock.Sleep(ctx, wait); err != nil {
			return 0, fmt.Errorf("progress topic %s[%d]: waiting for open transactions below %d: %w",
				pp.topic, pp.partition, hwm, err)
		}
	}
}

type listFunc func(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)

func (k *kafka) listed(ctx context.Context, pp progressPartition, list listFunc) (int64, error) {
	offs, err := list(ctx, pp.topic)
	if err != nil {
		return 0, err
	}
	o, ok := offs.Lookup(pp.topic, pp.partition)
	if !ok {
		return 0, kerr.UnknownTopicOrPartition
	}
	if o.Err != nil {
		return 0, k.denied(o.Err, ask("Describe", ResourceTopic, pp.topic))
	}
	return o.Offset, nil
}

// readProgress reads key's last committed progress record. found is false
// when there is none.
//
// It is meant to run once the producer with key's transactional id has
// been initialised: every transaction of that producer has ended then
// (InitProducerID answers once the last one's markers are written), so
// below the partition's high watermark each of key's records is followed
// by its transaction's marker. It reads the partition's end with
// read_uncommitted, a window of progressWindow offsets growing fourfold
// towards the start until the window holds one of key's committed records
// (it tells commit from abort by key's producer's markers), so
//   - a restart reads the few last records, not the whole partition (the
//     compacted topic's active segment is never compacted), and
//   - it never waits for another relay's transaction left open on the
//     shared partition, which holds back the last stable offset until its
//     transaction timeout.
//
// A record of key without its marker yet (a transaction of key still
// ending, when readProgress runs with none initialised) is waited for.
func (k *kafka) readProgress(ctx context.Context, topic, key string) (p Progress, found bool, err error) {
	pp, err := k.locateProgress(ctx, topic, key)
	if err != nil {
		return p, false, err
	}
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		last, found, open, err := k.readTail(ctx, pp, key)
		if err != nil {
			return p, false, err
		}
		if !open {
			if !found {
				return p, false, nil
			}
			p, err = DecodeProgress(last)
			return p, err == nil, err
		}
		if err := clock.Sleep(ctx, wait); err != nil {
			return p, false, fmt.Errorf("progress topic %s[%d]: waiting for the end of a transaction of %s: %w",
				pp.topic, pp.partition, key, err)
		}
	}
}

// progressWindow is the first window readProgress reads at the end of the
// progress partition: two offsets per transaction (the record and its
// marker) of every relay sharing it.
const progressWindow = 4096

// readTail reads the end of pp (see readProgress) for key's last committed
// record. open says a record of key has no marker yet.
func (k *kafka) readTail(ctx context.Context, pp progressPartition, key string) (last []byte, found, open bool, err error) {
	end, err := k.listed(ctx, pp, k.adm.ListEndOffsets)
	if err != nil {
		return nil, false, false, fmt.Errorf("progress topic %s[%d]: high watermark: %w", pp.topic, pp.partition, err)
	}
	start, err := k.listed(ctx, pp, k.adm.ListStartOffsets)
	if err != nil {
		return nil, false, false, fmt.Errorf("progress topic %s[%d]: start offset: %w", pp.topic, pp.partition, err)
	}
	for window := int64(progressWindow); ; window *= 4 {
		from := max(start, end-window)
		t := txnTail{key: key, pending: map[int64][]byte{}}
		if err := k.fetchUncommitted(ctx, pp, from, end, t.add); err != nil {
			return nil, false, false, err
		}
		if t.found || len(t.pending) > 0 || from <= start {
			return t.last, t.found, len(t.pending) > 0, nil
		}
	}
}

// txnTail follows one key's records through their transactions' markers,
// read with read_uncommitted in offset order.
type txnTail struct {
	key     string
	pending map[int64][]byte // by producer id: the key's last record in its open transaction
	last    []byte           // the key's last committed record
	found   bool
}

func (t *txnTail) add(r *kgo.Record) {
	if r.Attrs.IsControl() {
		v, ok := t.pending[r.ProducerID]
		if !ok {
			return
		}
		delete(t.pending, r.ProducerID)
		if isCommitMarker(r.Key) {
			t.last, t.found = v, true
		}
		return
	}
	if string(r.Key) != t.key {
		return
	}
	if !r.Attrs.IsTransactional() {
		t.last, t.found = r.Value, true
		return
	}
	t.pending[r.ProducerID] = r.Value
}

// isCommitMarker reads a control record's key: version (int16), then type
// (int16: 0 abort, 1 commit).
func isCommitMarker(key []byte) bool {
	return len(key) >= 4 && key[2] == 0 && key[3] == 1
}

// maxEmptyFetches bounds fetches that move no offset before the read gives up.
const maxEmptyFetches = 50

// fetchRange calls each with every committed data record in [from, to).
func (k *kafka) fetchRange(ctx context.Context, pp progressPartition, from, to int64, each func(*kgo.Record)) error {
	return k.fetchIn(ctx, pp, from, to, kgo.ReadCommitted(), func(r *kgo.Record) {
		if !r.Attrs.IsControl() {
			each(r)
		}
	})
}

// fetchUncommitted calls each with every record in [from, to), read with
// read_uncommitted, transaction markers included.
func (k *kafka) fetchUncommitted(ctx context.Context, pp progressPartition, from, to int64, each func(*kgo.Record)) error {
	return k.fetchIn(ctx, pp, from, to, kgo.ReadUncommitted(), each)
}

// fetchIn calls each with every record in [from, to) that a reader at
// level sees, control records included.
func (k *kafka) fetchIn(ctx context.Context, pp progressPartition, from, to int64, level kgo.IsolationLevel,
	each func(*kgo.Record)) error {
	for empty := 0; from < to; {
		fp, next, err := k.fetchOnce(ctx, pp, from, level)
		if err != nil {
			return k.denied(fmt.Errorf("progress topic %s[%d]: fetch at %d: %w", pp.topic, pp.partition, from, err),
				ask("Read", ResourceTopic, pp.topic))
		}
		for _, r := range fp.Records {
			if r.Offset < to {
				each(r)
			}
		}
		if next <= from {
			if empty++; empty > maxEmptyFetches {
				return fmt.Errorf("progress topic %s[%d]: no data at %d below the end %d", pp.topic, pp.partition, from, to)
			}
			continue
		}
		from, empty = next, 0
	}
	return nil
}

func (k *kafka) fetchOnce(ctx context.Context, pp progressPartition, offset int64, level kgo.IsolationLevel) (kgo.FetchPartition, int64, error) {
	resp, err := k.cl.Broker(int(pp.leader)).Request(ctx, fetchRequest(pp, offset, level))
	if err != nil {
		return kgo.FetchPartition{}, 0, err
	}
	fr := resp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(fr.ErrorCode); err != nil {
		return kgo.FetchPartition{}, 0, err
	}
	for _, t := range fr.Topics {
		for i := range t.Partitions {
			if t.Partitions[i].Partition != pp.partition {
				continue
			}
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				Offset: offset, IsolationLevel: level, KeepControlRecords: true,
				Topic: pp.topic, Partition: pp.partition,
			}, &t.Partitions[i], kgo.DefaultDecompressor(), nil)
			return fp, next, fp.Err
		}
	}
	return kgo.FetchPartition{}, 0, errors.New("the fetch response does not name the partition")
}

// fetchRequest is a one-off fetch of one partition at level.
func fetchRequest(pp progressPartition, offset int64, level kgo.IsolationLevel) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 200
	req.MinBytes = 1
	req.MaxBytes = 16 << 20
	req.IsolationLevel = 0 // read_uncommitted
	if level == kgo.ReadCommitted() {
		req.IsolationLevel = 1
	}
	req.SessionEpoch = -1 // a one-off fetch, no fetch session
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = pp.topic, pp.id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = pp.partition, offset, 8<<20
	rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}
