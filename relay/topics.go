package relay

import (
	"context"

	"github.com/outboxd/outboxd/outbox"
)

// ensureProgressTopic makes sure the progress topic exists, creating it
// compacted with one partition. Like Kafka Connect's offsets topic, it is
// the relay's own: Config.CreateTopics does not apply to it.
func (r *Relay) ensureProgressTopic(ctx context.Context) error {
	compact := "compact"
	spec := topicSpec{
		partitions: 1, replication: r.cfg.TopicReplication,
		configs: map[string]*string{"cleanup.policy": &compact}, need: "Read and Write",
	}
	return r.ensureTopics(ctx, []string{r.cfg.ProgressTopic}, true, spec)
}

// ensureOutputTopics makes sure the topics of rows exist, creating the
// missing ones when Config.CreateTopics allows.
func (r *Relay) ensureOutputTopics(ctx context.Context, rows []outbox.Row) error {
	var topics []string
	seen := map[string]bool{}
	for i := range rows {
		t := rows[i].Topic
		if !r.known[t] && !seen[t] {
			seen[t] = true
			topics = append(topics, t)
		}
	}
	spec := topicSpec{partitions: r.cfg.TopicPartitions, replication: r.cfg.TopicReplication, need: "Write"}
	return r.ensureTopics(ctx, topics, r.cfg.CreateTopics, spec)
}

func (r *Relay) ensureTopics(ctx context.Context, topics []string, create bool, spec topicSpec) error {
	if len(topics) == 0 {
		return nil
	}
	if err := r.kafka.ensureTopics(ctx, topics, create, spec); err != nil {
		return err
	}
	for _, t := range topics {
		r.known[t] = true
	}
	return nil
}
