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

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// kafka is the relay's franz-go side: topic metadata and creation, and the
// read_committed reads of the progress topic. Records are produced by
// sarama (producer.go).
type kafka struct {
	cl        *kgo.Client
	adm       *kadm.Client
	principal string // who the brokers' ACLs see, for *AuthorizationError
}

func newKafka(brokers []string, sec kafkasec.Settings) (*kafka, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("outboxd-relay-admin"),
		kgo.DialTimeout(5 * time.Second),
		// Fail an attempt soon while Kafka is away; the relay retries it.
		kgo.RetryTimeout(3 * time.Second),
		// Offsets are listed right after a topic is created.
		kgo.MetadataMinAge(100 * time.Millisecond),
	}, sec.Kgo()...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	return &kafka{cl: cl, adm: kadm.NewClient(cl), principal: sec.Principal()}, nil
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
	resps, err := k.adm.CreateTopics(ctx, spec.partitions, spec.replication, spec.configs, missing...)
	if err == nil && spec.fallback != nil {
		var refused []string
		for _, t := range missing {
			if r, ok := resps[t]; ok && errors.Is(r.Err, kerr.InvalidConfig) {
				refused = append(refused, t)
			}
		}
		if len(refused) > 0 {
			var again kadm.CreateTopicResponses
			again, err = k.adm.CreateTopics(ctx, spec.partitions, spec.replication, spec.fallback, refused...)
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
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return k.denied(fmt.Errorf("create topic %s: %w (%s)", t, r.Err, r.ErrMessage),
				ask("Create", ResourceTopic, t), ask("Create", ResourceCluster, clusterName))
		}
	}
	return nil
}

// missingTopics returns the topics that do not exist; a refusal to
// describe one is explained as a lack of need (see topicSpec).
func (k *kafka) missingTopics(ctx context.Context, topics []string, need string) ([]string, error) {
	md, err := k.metadata(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("describe topics %v: %w", topics, err)
	}
	var missing []string
	for _, t := range topics {
		td, ok := md[t]
		switch err := kerr.ErrorForCode(td.ErrorCode); {
		case !ok || errors.Is(err, kerr.UnknownTopicOrPartition):
			missing = append(missing, t)
		case err != nil:
			return nil, k.denied(fmt.Errorf("describe topic %s: %w", t, err), ask(need, ResourceTopic, t))
		}
	}
	return missing, nil
}

// topicConfigs returns the settings of topic as its broker describes them.
func (k *kafka) topicConfigs(ctx context.Context, topic string) (map[string]string, error) {
	rcs, err := k.adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return nil, err
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return nil, err
	}
	if rc.Err != nil {
		return nil, rc.Err
	}
	m := make(map[string]string, len(rc.Configs))
	for _, c := range rc.Configs {
		if c.Value != nil {
			m[c.Key] = *c.Value
		}
	}
	return m, nil
}

// metadata describes topics, straight from a broker: kadm's cached
// metadata would still call a topic missing seconds after it was created.
func (k *kafka) metadata(ctx context.Context, topics ...string) (map[string]kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, k.cl)
	if err != nil {
		return nil, err
	}
	m := make(map[string]kmsg.MetadataResponseTopic, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic != nil {
			m[*t.Topic] = t
		}
	}
	return m, nil
}
