package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox"
)

// kafkaTopics answers the API's GET /topics from the server's cluster,
// with the brokers and security the relay and the feeds use. Each call
// opens a client of its own and closes it: the listing is an operator's
// occasional look, and nothing stays open for it in between.
type kafkaTopics struct {
	brokers []string
	sec     kafkasec.Settings
	// groups are the consumer groups of the Kafka feeds, by topic.
	groups map[string][]string
}

var _ api.Kafka = kafkaTopics{}

// newKafkaTopics is the cluster of m's configuration.
func newKafkaTopics(m *Main) kafkaTopics {
	k := kafkaTopics{brokers: m.Config.Brokers, sec: m.Config.Kafka.Settings, groups: map[string][]string{}}
	for name, fc := range m.Config.Feeds {
		if topic, ok := strings.CutPrefix(fc.Source, "kafka:"); ok {
			group := fc.Group
			if group == "" {
				group = "outboxd-" + name
			}
			k.groups[topic] = append(k.groups[topic], group)
		}
	}
	for _, gs := range k.groups {
		sort.Strings(gs)
	}
	return k
}

func (k kafkaTopics) admin() (*kafka.Client, error) {
	return kafka.New(k.brokers, "outboxd-api-topics", k.sec)
}

// Topics lists the cluster's topics, internal ones included.
func (k kafkaTopics) Topics(ctx context.Context) ([]api.KafkaTopic, error) {
	adm, err := k.admin()
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	tds, err := adm.Topics(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	out := make([]api.KafkaTopic, 0, len(tds))
	for name, td := range tds {
		if td.Err != sarama.ErrNoError {
			continue
		}
		out = append(out, api.KafkaTopic{Topic: name, Partitions: len(td.Partitions), Internal: td.Internal})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	return out, nil
}

// Topic describes one topic: each partition's leader, start and end
// offsets, and the offsets of the feeds' groups and of groups.
func (k kafkaTopics) Topic(ctx context.Context, name string, groups []string) (api.KafkaTopicDetail, error) {
	adm, err := k.admin()
	if err != nil {
		return api.KafkaTopicDetail{}, err
	}
	defer adm.Close()
	tds, err := adm.Metadata(ctx, []string{name}, false)
	if err != nil {
		return api.KafkaTopicDetail{}, fmt.Errorf("describe topic %s: %w", name, err)
	}
	td, ok := tds[name]
	if !ok || td.Err == sarama.ErrUnknownTopicOrPartition {
		return api.KafkaTopicDetail{}, fmt.Errorf("topic %s: %w", name, outbox.ErrNotFound)
	}
	if td.Err != sarama.ErrNoError {
		return api.KafkaTopicDetail{}, fmt.Errorf("describe topic %s: %w", name, td.Err)
	}
	parts := slices.Clone(td.Partitions)
	slices.SortFunc(parts, func(a, b kafka.Partition) int { return cmp.Compare(a.ID, b.ID) })
	ids := make([]int32, len(parts))
	for i, p := range parts {
		ids[i] = p.ID
	}
	d := api.KafkaTopicDetail{Topic: name, Groups: mergeGroups(k.groups[name], groups)}
	committed := map[string]map[int32]int64{}
	for _, g := range d.Groups {
		os, err := adm.CommittedOffsets(ctx, g, name, ids)
		if err != nil {
			return api.KafkaTopicDetail{}, fmt.Errorf("offsets of group %s on %s: %w", g, name, err)
		}
		committed[g] = os
	}
	for _, p := range parts {
		part := api.KafkaPartition{Partition: p.ID, Leader: p.Leader, Groups: []api.GroupLag{}, Positions: []api.FeedOffset{}}
		if p.Leader >= 0 {
			var err error
			if part.Start, err = partitionOffset(ctx, adm, name, p, kafka.Earliest); err != nil {
				return api.KafkaTopicDetail{}, fmt.Errorf("start offset of %s[%d]: %w", name, p.ID, err)
			}
			if part.End, err = partitionOffset(ctx, adm, name, p, kafka.Latest); err != nil {
				return api.KafkaTopicDetail{}, fmt.Errorf("end offset of %s[%d]: %w", name, p.ID, err)
			}
		}
		for _, g := range d.Groups {
			gl := api.GroupLag{Group: g, Lag: max(part.End-part.Start, 0)}
			if at, ok := committed[g][p.ID]; ok {
				gl.Committed, gl.Lag = &at, max(part.End-at, 0)
			}
			part.Groups = append(part.Groups, gl)
		}
		d.Partitions = append(d.Partitions, part)
	}
	return d, nil
}

// partitionOffset is p's offset at at; a partition's own error (a leader
// moving) shows as 0, as a partition without offsets; no answer is an
// error.
func partitionOffset(ctx context.Context, adm *kafka.Client, topic string, p kafka.Partition, at int64) (int64, error) {
	o, err := adm.ListOffset(ctx, topic, p.ID, p.Leader, at, sarama.ReadUncommitted)
	var code sarama.KError
	if errors.As(err, &code) {
		return 0, nil
	}
	return o, err
}

// mergeGroups is a and b without repeats, a's first.
func mergeGroups(a, b []string) []string {
	out := []string{}
	seen := map[string]bool{}
	for _, g := range append(append([]string{}, a...), b...) {
		if g != "" && !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
	}
	return out
}
