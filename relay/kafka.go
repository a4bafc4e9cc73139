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
)

// kafka is the relay's franz-go side: topic metadata and creation, and the
// read_committed reads of the progress topic. Records are produced by
// sarama (producer.go).
type kafka struct {
	cl  *kgo.Client
	adm *kadm.Client
}

func newKafka(brokers []string) (*kafka, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("outboxd-relay-admin"),
		kgo.DialTimeout(5*time.Second),
		// Fail an attempt soon while Kafka is away; the relay retries it.
		kgo.RetryTimeout(3*time.Second),
		// Offsets are listed right after a topic is created.
		kgo.MetadataMinAge(100*time.Millisecond),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	return &kafka{cl: cl, adm: kadm.NewClient(cl)}, nil
}

func (k *kafka) close() { k.cl.Close() }

// topicSpec is how a topic the relay creates is made.
type topicSpec struct {
	partitions  int32
	replication int16
	configs     map[string]*string
}

// ensureTopics checks that every topic exists and creates the missing ones
// when create is true; otherwise a missing topic is a *MissingTopicError.
func (k *kafka) ensureTopics(ctx context.Context, topics []string, create bool, spec topicSpec) error {
	missing, err := k.missingTopics(ctx, topics)
	if err != nil || len(missing) == 0 {
		return err
	}
	if !create {
		return &MissingTopicError{Topic: missing[0]}
	}
	resps, err := k.adm.CreateTopics(ctx, spec.partitions, spec.replication, spec.configs, missing...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", missing, err)
	}
	for _, t := range missing {
		r, ok := resps[t]
		if !ok {
			return fmt.Errorf("create topic %s: no answer", t)
		}
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w (%s)", t, r.Err, r.ErrMessage)
		}
	}
	return nil
}

// missingTopics returns the topics that do not exist.
func (k *kafka) missingTopics(ctx context.Context, topics []string) ([]string, error) {
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
			return nil, fmt.Errorf("describe topic %s: %w", t, err)
		}
	}
	return missing, nil
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
