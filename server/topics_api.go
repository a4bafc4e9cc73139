package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/api"
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

func (k kafkaTopics) admin() (*kadm.Client, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(k.brokers...),
		kgo.ClientID("outboxd-api-topics"),
		kgo.DialTimeout(5 * time.Second),
		kgo.RetryTimeout(5 * time.Second),
	}, kgoOpts(k.sec)...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return kadm.NewClient(cl), nil
}

// Topics lists the cluster's topics, internal ones included.
func (k kafkaTopics) Topics(ctx context.Context) ([]api.KafkaTopic, error) {
	adm, err := k.admin()
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	tds, err := adm.ListTopicsWithInternal(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	out := make([]api.KafkaTopic, 0, len(tds))
	for _, name := range tds.Names() {
		td := tds[name]
		if td.Err != nil {
			continue
		}
		out = append(out, api.KafkaTopic{Topic: name, Partitions: len(td.Partitions), Internal: td.IsInternal})
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
	tds, err := adm.ListTopics(ctx, name)
	if err != nil {
		return api.KafkaTopicDetail{}, fmt.Errorf("describe topic %s: %w", name, err)
	}
	td, ok := tds[name]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return api.KafkaTopicDetail{}, fmt.Errorf("topic %s: %w", name, outbox.ErrNotFound)
	}
	if td.Err != nil {
		return api.KafkaTopicDetail{}, fmt.Errorf("describe topic %s: %w", name, td.Err)
	}
	starts, err := adm.ListStartOffsets(ctx, name)
	if err != nil {
		return api.KafkaTopicDetail{}, fmt.Errorf("start offsets of %s: %w", name, err)
	}
	ends, err := adm.ListEndOffsets(ctx, name)
	if err != nil {
		return api.KafkaTopicDetail{}, fmt.Errorf("end offsets of %s: %w", name, err)
	}
	d := api.KafkaTopicDetail{Topic: name, Groups: mergeGroups(k.groups[name], groups)}
	committed := map[string]kadm.OffsetResponses{}
	for _, g := range d.Groups {
		os, err := adm.FetchOffsetsForTopics(ctx, g, name)
		if errors.Is(err, kerr.GroupIDNotFound) {
			os, err = kadm.OffsetResponses{}, nil // a group that never committed
		}
		if err != nil {
			return api.KafkaTopicDetail{}, fmt.Errorf("offsets of group %s on %s: %w", g, name, err)
		}
		committed[g] = os
	}
	for _, p := range td.Partitions.Sorted() {
		part := api.KafkaPartition{Partition: p.Partition, Leader: p.Leader, Groups: []api.GroupLag{}, Positions: []api.FeedOffset{}}
		if o, ok := starts.Lookup(name, p.Partition); ok && o.Err == nil {
			part.Start = o.Offset
		}
		if o, ok := ends.Lookup(name, p.Partition); ok && o.Err == nil {
			part.End = o.Offset
		}
		for _, g := range d.Groups {
			gl := api.GroupLag{Group: g, Lag: max(part.End-part.Start, 0)}
			if o, ok := committed[g].Lookup(name, p.Partition); ok && o.Err == nil && o.At >= 0 {
				at := o.At
				gl.Committed, gl.Lag = &at, max(part.End-at, 0)
			}
			part.Groups = append(part.Groups, gl)
		}
		d.Partitions = append(d.Partitions, part)
	}
	return d, nil
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
