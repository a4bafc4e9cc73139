package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/clock"
	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
)

// The progress topic is read with raw fetches (internal/kafka's Fetch),
// not a consumer: a fetch reports the offset past aborted batches and
// transaction markers, so "read to the end" stops exactly at the end even
// when the log ends in a marker.

// progressPartition is where a relay's progress records live.
type progressPartition struct {
	topic     string
	partition int32
	leader    int32
}

// codeErr is code as an error: nil for ErrNoError.
func codeErr(code sarama.KError) error {
	if code == sarama.ErrNoError {
		return nil
	}
	return code
}

// locateProgress finds the partition holding key's records.
func (k *kafka) locateProgress(ctx context.Context, topic, key string) (progressPartition, error) {
	md, err := k.cl.Metadata(ctx, []string{topic}, false)
	if err != nil {
		return progressPartition{}, fmt.Errorf("progress topic %s: metadata: %w", topic, err)
	}
	td, ok := md[topic]
	if !ok {
		return progressPartition{}, fmt.Errorf("progress topic %s: %w", topic, sarama.ErrUnknownTopicOrPartition)
	}
	if err := codeErr(td.Err); err != nil {
		return progressPartition{}, k.denied(fmt.Errorf("progress topic %s: %w", topic, err), ask("Describe", ResourceTopic, topic))
	}
	part, err := partitionFor(topic, key, len(td.Partitions))
	if err != nil {
		return progressPartition{}, fmt.Errorf("progress topic %s: partition for %s: %w", topic, key, err)
	}
	for _, pd := range td.Partitions {
		if pd.ID != part {
			continue
		}
		if err := codeErr(pd.Err); err != nil || pd.Leader < 0 {
			return progressPartition{}, fmt.Errorf("progress topic %s[%d]: no leader: %w", topic, part, cmpErr(err, sarama.ErrLeaderNotAvailable))
		}
		return progressPartition{topic: topic, partition: part, leader: pd.Leader}, nil
	}
	return progressPartition{}, fmt.Errorf("progress topic %s[%d]: %w", topic, part, sarama.ErrUnknownTopicOrPartition)
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
	hwm, err := k.listed(ctx, pp, kafkaclient.Latest, sarama.ReadUncommitted)
	if err != nil {
		return 0, fmt.Errorf("progress topic %s[%d]: high watermark: %w", pp.topic, pp.partition, err)
	}
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		lso, err := k.listed(ctx, pp, kafkaclient.Latest, sarama.ReadCommitted)
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

// listed is the partition's offset at at (kafkaclient.Earliest: its
// start; kafkaclient.Latest: its end as a reader at level sees it).
func (k *kafka) listed(ctx context.Context, pp progressPartition, at int64, level sarama.IsolationLevel) (int64, error) {
	o, err := k.cl.ListOffset(ctx, pp.topic, pp.partition, pp.leader, at, level)
	if err != nil {
		return 0, k.denied(err, ask("Describe", ResourceTopic, pp.topic))
	}
	return o, nil
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
	end, err := k.listed(ctx, pp, kafkaclient.Latest, sarama.ReadUncommitted)
	if err != nil {
		return nil, false, false, fmt.Errorf("progress topic %s[%d]: high watermark: %w", pp.topic, pp.partition, err)
	}
	start, err := k.listed(ctx, pp, kafkaclient.Earliest, sarama.ReadUncommitted)
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

func (t *txnTail) add(r kafkaclient.Record) {
	if r.Control {
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
	if !r.Transactional {
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
func (k *kafka) fetchRange(ctx context.Context, pp progressPartition, from, to int64, each func(kafkaclient.Record)) error {
	return k.fetchIn(ctx, pp, from, to, sarama.ReadCommitted, func(r kafkaclient.Record) {
		if !r.Control {
			each(r)
		}
	})
}

// fetchUncommitted calls each with every record in [from, to), read with
// read_uncommitted, transaction markers included.
func (k *kafka) fetchUncommitted(ctx context.Context, pp progressPartition, from, to int64, each func(kafkaclient.Record)) error {
	return k.fetchIn(ctx, pp, from, to, sarama.ReadUncommitted, each)
}

// fetchIn calls each with every record in [from, to) that a reader at
// level sees, control records included.
func (k *kafka) fetchIn(ctx context.Context, pp progressPartition, from, to int64, level sarama.IsolationLevel,
	each func(kafkaclient.Record)) error {
	for empty := 0; from < to; {
		f, err := k.cl.Fetch(ctx, pp.topic, pp.partition, pp.leader, from, level)
		if err != nil {
			return k.denied(fmt.Errorf("progress topic %s[%d]: fetch at %d: %w", pp.topic, pp.partition, from, err),
				ask("Read", ResourceTopic, pp.topic))
		}
		for _, r := range f.Records {
			if r.Offset < to {
				each(r)
			}
		}
		if f.Next <= from {
			if empty++; empty > maxEmptyFetches {
				return fmt.Errorf("progress topic %s[%d]: no data at %d below the end %d", pp.topic, pp.partition, from, to)
			}
			continue
		}
		from, empty = f.Next, 0
	}
	return nil
}
