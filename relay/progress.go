package relay

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/outbox"
)

// Progress is the value of the record the exactly-once relay commits with
// every transaction, keyed by its relay id on the progress topic: the last
// outbox row in the transaction, and that row's place. It is how Kafka
// Connect's exactly-once source connectors keep their offsets (KIP-618):
// the offset commits if and only if the records it covers do.
type Progress struct {
	// LastID is the last outbox id in the transaction.
	LastID int64 `json:"lastId"`
	// Feed, Partition, Epoch, Position and N are that row's place: they
	// let a restart check that the row with id LastID in the database is
	// the row that was published.
	Feed      string `json:"feed"`
	Partition int32  `json:"partition"`
	Epoch     string `json:"epoch"`
	Position  int64  `json:"position"`
	N         int    `json:"n"`
	// Path and Host name the database that published: its absolute path
	// and the host's name; At is when, in Unix milliseconds. They let a
	// new database at the same place learn that an earlier one published
	// there (Relay.CheckDatabase). Records of older versions lack them.
	Path string `json:"path,omitempty"`
	Host string `json:"host,omitempty"`
	At   int64  `json:"at,omitempty"`
}

func progressOf(r *outbox.Row) Progress {
	return Progress{LastID: r.ID, Feed: r.Feed, Partition: r.Partition, Epoch: r.Epoch, Position: r.Position, N: r.N}
}

// names reports whether r is the row p was written for.
func (p Progress) names(r *outbox.Row) bool {
	return r.ID == p.LastID && r.Feed == p.Feed && r.Partition == p.Partition &&
		r.Epoch == p.Epoch && r.Position == p.Position && r.N == p.N
}

// DecodeProgress parses a progress record's value.
func DecodeProgress(b []byte) (Progress, error) {
	var p Progress
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("decode progress record: %w", err)
	}
	return p, nil
}

// progressRecord is the record that commits p with the transaction,
// stamped now.
func progressRecord(topic, relayID string, p Progress) (*record, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode progress record: %w", err)
	}
	rec := &record{topic: topic, at: time.Now().UnixMilli(), rec: sarama.Record{Key: []byte(relayID), Value: b}}
	rec.size = recordSize(&rec.rec)
	return rec, nil
}

// partitionFor is the partition the producer's murmur2 partitioner sends
// key to, so the reader looks where the writer wrote.
func partitionFor(topic, key string, partitions int) (int32, error) {
	p := sarama.NewMurmur2Partitioner(topic)
	return p.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, int32(partitions))
}
