package server

import (
	"flag"
	"fmt"
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
	RequestTimeout   time.Duration `yaml:"requestTimeout"`
	DeliveryTimeout  time.Duration `yaml:"deliveryTimeout"`
	Timestamp        string        `yaml:"timestamp"`
}

// DefaultRelayConfig returns the relay defaults.
func DefaultRelayConfig() RelayConfig {
	d := relay.DefaultConfig()
	return RelayConfig{
		Mode:             string(d.Mode),
		ProgressTopic:    d.ProgressTopic,
		Batch:            d.Batch,
		Wait:             d.Wait,
		CreateTopics:     d.CreateTopics,
		TopicPartitions:  int(d.TopicPartitions),
		TopicReplication: int(d.TopicReplication),
		Retention:        d.Retention,
		RequestTimeout:   d.RequestTimeout,
		DeliveryTimeout:  d.DeliveryTimeout,
		Timestamp:        d.Timestamp,
	}
}

func (r *RelayConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&r.Mode, "relay", r.Mode, "relay `MODE`: exactly-once, at-least-once, or none (keep the outbox, publish nothing)")
	fs.StringVar(&r.TransactionalID, "transactional-id", r.TransactionalID, "the relay's Kafka transactional `ID` (none: outboxd-<an id kept in the database>)")
	fs.StringVar(&r.ProgressTopic, "progress-topic", r.ProgressTopic, "compacted topic (`T`) of the relay's exactly-once progress")
	fs.IntVar(&r.Batch, "relay-batch", r.Batch, "most outbox rows (`N`) per Kafka transaction")
	fs.DurationVar(&r.Wait, "relay-wait", r.Wait, "how long (`D`) a short batch waits for more rows before it is published")
	fs.BoolVar(&r.CreateTopics, "create-topics", r.CreateTopics, "create missing output topics (false: a missing topic is an error)")
	fs.IntVar(&r.TopicPartitions, "topic-partitions", r.TopicPartitions, "partitions (`N`) of the topics the relay (or the dev broker) creates")
	fs.IntVar(&r.TopicReplication, "topic-replication", r.TopicReplication, "replication factor (`N`) of the topics the relay creates")
	fs.DurationVar(&r.Retention, "outbox-retention", r.Retention, "keep published outbox rows this long (`D`; 0: prune at once)")
	fs.DurationVar(&r.RequestTimeout, "relay-request-timeout", r.RequestTimeout,
		"how long (`D`) the relay waits for a broker's answer to one request")
	fs.DurationVar(&r.DeliveryTimeout, "relay-delivery-timeout", r.DeliveryTimeout,
		"how long (`D`) a batch a leader refuses as moving or busy is sent again, and a moving coordinator asked again, "+
			"before the relay starts its session over (at least --relay-request-timeout, below the 1m transaction timeout)")
	fs.StringVar(&r.Timestamp, "relay-timestamp", r.Timestamp,
		"a record's timestamp (`WHEN`): publish (when the relay sends it) or created (its outbox row's commit; "+
			"a record a broker refuses as too old is a dead letter output-invalid-timestamp)")
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
	c.Mode = relay.Mode(r.Mode)
	c.TransactionalID = r.TransactionalID
	c.ProgressTopic = r.ProgressTopic
	c.Batch = r.Batch
	c.Wait = r.Wait
	c.CreateTopics = r.CreateTopics
	c.TopicPartitions = int32(r.TopicPartitions)
	c.TopicReplication = int16(r.TopicReplication)
	c.Retention = r.Retention
	c.RequestTimeout = r.RequestTimeout
	c.DeliveryTimeout = r.DeliveryTimeout
	c.Timestamp = r.Timestamp
	return c
}
