package server

import (
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/outboxd/outboxd/relay"
)

// modeNone turns the relay off: the outbox fills and nothing is published.
const modeNone = "none"

// RelayConfig is the relay's part of the configuration.
type RelayConfig struct {
	Mode             string        `yaml:"mode"`
	TransactionalID  string        `yaml:"transactionalId"`
	ProgressTopic    string        `yaml:"progressTopic"`
	Batch            int           `yaml:"batch"`
	Wait             time.Duration `yaml:"wait"`
	CreateTopics     bool          `yaml:"createTopics"`
	TopicPartitions  int           `yaml:"topicPartitions"`
	TopicReplication int           `yaml:"topicReplication"`
	Retention        time.Duration `yaml:"outboxRetention"`
	DevBrokerAddr    string        `yaml:"devBrokerAddr"`
	// DevBrokerData is the dev broker's data directory: DevBrokerDataAuto
	// for "devbroker" beside the database, "" for memory only.
	DevBrokerData string `yaml:"devBrokerData"`
}

// DevBrokerDataAuto, as --dev-broker-data, keeps the dev broker's log in
// the directory "devbroker" beside the database.
const DevBrokerDataAuto = "auto"

// devBrokerDir is the dev broker's data directory for a database at db, ""
// for memory only.
func (r RelayConfig) devBrokerDir(db string) string {
	if r.DevBrokerData == DevBrokerDataAuto {
		return filepath.Join(filepath.Dir(db), "devbroker")
	}
	return r.DevBrokerData
}

// DefaultRelayConfig returns the relay defaults.
func DefaultRelayConfig() RelayConfig {
	d := relay.DefaultConfig()
	return RelayConfig{
		Mode:             d.Mode,
		ProgressTopic:    d.ProgressTopic,
		Batch:            d.Batch,
		Wait:             d.Wait,
		CreateTopics:     d.CreateTopics,
		TopicPartitions:  int(d.TopicPartitions),
		TopicReplication: int(d.TopicReplication),
		Retention:        d.Retention,
		DevBrokerAddr:    "127.0.0.1:9092",
		DevBrokerData:    DevBrokerDataAuto,
	}
}

func (r *RelayConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&r.Mode, "relay", r.Mode, "exactly-once, at-least-once, or none (keep the outbox, publish nothing)")
	fs.StringVar(&r.TransactionalID, "transactional-id", r.TransactionalID, "Kafka transactional id of the relay (default: outboxd-<id kept in the database>)")
	fs.StringVar(&r.ProgressTopic, "progress-topic", r.ProgressTopic, "compacted topic of the relay's exactly-once progress")
	fs.IntVar(&r.Batch, "relay-batch", r.Batch, "most outbox rows per Kafka transaction")
	fs.DurationVar(&r.Wait, "relay-wait", r.Wait, "how long a short batch waits for more rows before it is published")
	fs.BoolVar(&r.CreateTopics, "create-topics", r.CreateTopics, "create missing output topics (false: a missing topic is an error)")
	fs.IntVar(&r.TopicPartitions, "topic-partitions", r.TopicPartitions, "partitions of topics the relay creates")
	fs.IntVar(&r.TopicReplication, "topic-replication", r.TopicReplication, "replication factor of topics the relay creates")
	fs.DurationVar(&r.Retention, "outbox-retention", r.Retention, "keep published outbox rows this long (0: prune at once)")
	fs.StringVar(&r.DevBrokerAddr, "dev-broker-addr", r.DevBrokerAddr, "listen address of the in-process dev broker started when --brokers is empty")
	fs.StringVar(&r.DevBrokerData, "dev-broker-data", r.DevBrokerData, "the dev broker's data directory: auto for devbroker/ beside --db, '' for memory only")
}

// Validate reports an invalid relay setting.
func (r RelayConfig) Validate() error {
	if r.Mode == modeNone {
		return nil
	}
	if err := r.relayConfig(nil).Validate(); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// relayConfig is the relay package's configuration for these settings.
func (r RelayConfig) relayConfig(brokers []string) relay.Config {
	c := relay.DefaultConfig()
	if len(brokers) > 0 {
		c.Brokers = brokers
	}
	c.Mode = r.Mode
	c.TransactionalID = r.TransactionalID
	c.ProgressTopic = r.ProgressTopic
	c.Batch = r.Batch
	c.Wait = r.Wait
	c.CreateTopics = r.CreateTopics
	c.TopicPartitions = int32(r.TopicPartitions)
	c.TopicReplication = int16(r.TopicReplication)
	c.Retention = r.Retention
	return c
}
