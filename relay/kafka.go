package relay

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"

	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
)

// kafka is the relay's side of Kafka other than producing: topic metadata
// and creation, ACL probes and the reads of the progress topic, through
// internal/kafka. Records are produced by sarama (txnproducer.go,
// producer.go).
type kafka struct {
	cl        *kafkaclient.Client
	principal string // who the brokers' ACLs see, for *AuthorizationError
}

func newKafka(brokers []string, sec kafkasec.Settings) (*kafka, error) {
	cl, err := kafkaclient.New(brokers, "outboxd-relay-admin", sec)
	if err != nil {
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	return &kafka{cl: cl, principal: cl.Principal}, nil
}

func (k *kafka) close() { k.cl.Close() }

// denied explains a refusal in err (see denied).
func (k *kafka) denied(err error, asks ...kafkasec.Ask) error {
	return denied(err, k.principal, asks...)
}

// topicSpec is how a topic the relay creates is made.
type topicSpec struct {
	partitions  int32
	replication int16
	configs     map[string]*string
	// fallback, when set, are the configs to create a topic with when
	// the broker refuses configs as invalid (settings it does not know).
	fallback map[string]*string
	// need is what the relay does with the topics ("Write", "Read and
	// Write"): a refused description of one names it, since each implies
	// Describe, and granting Describe alone would only move the refusal.
	need string
}

// ensureTopics checks that every topic exists and creates the missing ones
// when create is true; otherwise a missing topic is a *MissingTopicError.
func (k *kafka) ensureTopics(ctx context.Context, topics []string, create bool, spec topicSpec) error {
	missing, err := k.missingTopics(ctx, topics, spec.need)
	if err != nil || len(missing) == 0 {
		return err
	}
	if !create {
		return &MissingTopicError{Topic: missing[0]}
	}
	create1 := func(configs map[string]*string, topics []string) (map[string]kafkaclient.TopicResult, error) {
		return k.cl.CreateTopics(ctx, kafkaclient.TopicSpec{Partitions: spec.partitions, Replication: spec.replication,
			Configs: configs}, topics...)
	}
	resps, err := create1(spec.configs, missing)
	if err == nil && spec.fallback != nil {
		var refused []string
		for _, t := range missing {
			if r, ok := resps[t]; ok && r.Err == sarama.ErrInvalidConfig {
				refused = append(refused, t)
			}
		}
		if len(refused) > 0 {
			var again map[string]kafkaclient.TopicResult
			again, err = create1(spec.fallback, refused)
			for t, r := range again {
				resps[t] = r
			}
		}
	}
	if err != nil {
		return k.denied(fmt.Errorf("create topics %v: %w", missing, err),
			ask("Create", ResourceTopic, missing[0]), ask("Create", ResourceCluster, clusterName))
	}
	for _, t := range missing {
		r, ok := resps[t]
		if !ok {
			return fmt.Errorf("create topic %s: no answer", t)
		}
		if r.Err != sarama.ErrNoError && r.Err != sarama.ErrTopicAlreadyExists {
			return k.denied(fmt.Errorf("create topic %s: %w (%s)", t, r.Err, r.Message),
				ask("Create", ResourceTopic, t), ask("Create", ResourceCluster, clusterName))
		}
	}
	return nil
}

// missingTopics returns the topics that do not exist; a refusal to
// describe one is explained as a lack of need (see topicSpec).
func (k *kafka) missingTopics(ctx context.Context, topics []string, need string) ([]string, error) {
	md, err := k.cl.Metadata(ctx, topics, false)
	if err != nil {
		return nil, fmt.Errorf("describe topics %v: %w", topics, err)
	}
	var missing []string
	for _, t := range topics {
		td, ok := md[t]
		switch {
		case !ok || td.Err == sarama.ErrUnknownTopicOrPartition:
			missing = append(missing, t)
		case td.Err != sarama.ErrNoError:
			return nil, k.denied(fmt.Errorf("describe topic %s: %w", t, td.Err), ask(need, ResourceTopic, t))
		}
	}
	return missing, nil
}

// topicConfigs returns the settings of topic as its broker describes them.
func (k *kafka) topicConfigs(ctx context.Context, topic string) (map[string]string, error) {
	return k.cl.TopicConfigs(ctx, topic)
}
