package relay

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/outbox"
)

// progressTopicConfigs are the progress topic's settings. Compaction keeps
// each relay's last record, but never in a log's active segment, which a
// broker rolls at 1 GiB or after 7 days by default: at 50 transactions a
// second that is a GiB a restart would read. segment.ms and segment.bytes
// roll it within 10 minutes or 16 MiB; min.compaction.lag.ms lets the
// cleaner compact a rolled segment at once and max.compaction.lag.ms makes
// it do so within an hour, however little of the log is dirty. A broker
// that does not know the optional ones (some test brokers) gets the
// others.
var progressTopicConfigs = []struct {
	key, value string
	optional   bool
}{
	{"cleanup.policy", "compact", false},
	{"segment.ms", "600000", false},
	{"segment.bytes", "16777216", false},
	{"min.compaction.lag.ms", "0", true},
	{"max.compaction.lag.ms", "3600000", true},
}

// ensureProgressTopic makes sure the progress topic exists, creating it
// compacted with one partition and progressTopicConfigs. Like Kafka
// Connect's offsets topic, it is the relay's own: Config.CreateTopics does
// not apply to it. The first time in a Run it checks an existing topic's
// settings (see checkProgressTopic).
func (r *Relay) ensureProgressTopic(ctx context.Context) error {
	all, required := map[string]*string{}, map[string]*string{}
	for _, c := range progressTopicConfigs {
		all[c.key] = &c.value
		if !c.optional {
			required[c.key] = &c.value
		}
	}
	spec := topicSpec{
		partitions: 1, replication: r.cfg.TopicReplication,
		configs: all, fallback: required, need: "Read and Write",
	}
	if err := r.ensureTopics(ctx, []string{r.cfg.ProgressTopic}, true, spec); err != nil {
		return err
	}
	if !r.progressChecked {
		r.progressChecked = true
		r.checkProgressTopic(ctx)
	}
	return nil
}

// checkProgressTopic warns, once, when the progress topic's settings are
// not progressTopicConfigs' (a topic made by hand, or by an older
// outboxd): not compacted, or segments (or compaction lags) longer, so a
// restart reads more than it needs. Nothing stops: the settings change
// how long a restart takes, not what it finds. A broker that does not let
// the relay describe the topic's settings is passed over.
func (r *Relay) checkProgressTopic(ctx context.Context) {
	got, err := r.kafka.topicConfigs(ctx, r.cfg.ProgressTopic)
	if err != nil {
		r.log.Debug("the progress topic's settings cannot be read; not checked", "topic", r.cfg.ProgressTopic, "err", err)
		return
	}
	var lacking, have []string
	for _, c := range progressTopicConfigs {
		v, ok := got[c.key]
		if !ok {
			continue // a broker that does not have it
		}
		if !configAtMost(c.key, v, c.value) {
			lacking = append(lacking, c.key+"="+c.value)
			have = append(have, c.key+"="+v)
		}
	}
	if len(lacking) == 0 {
		return
	}
	r.log.Warn("the progress topic lacks the settings that let compaction keep it short; a restart reads more of it "+
		"than it needs: kafka-configs.sh --alter --entity-type topics --entity-name "+r.cfg.ProgressTopic+
		" --add-config "+strings.Join(lacking, ","), "topic", r.cfg.ProgressTopic, "have", strings.Join(have, ","))
}

// configAtMost reports whether the value have of the setting key is as
// good for the progress topic as want: cleanup.policy holds compact, a
// duration or size is at most want's.
func configAtMost(key, have, want string) bool {
	if key == "cleanup.policy" {
		return slices.Contains(strings.Split(have, ","), want)
	}
	h, err1 := strconv.ParseInt(have, 10, 64)
	w, err2 := strconv.ParseInt(want, 10, 64)
	return err1 == nil && err2 == nil && h <= w
}

// ensureOutputTopics makes sure the topics of rows exist, creating the
// missing ones when Config.CreateTopics allows.
func (r *Relay) ensureOutputTopics(ctx context.Context, rows []outbox.Row) error {
	var topics []string
	seen := map[string]bool{}
	for i := range rows {
		t := rows[i].Topic
		if i > 0 && t == rows[i-1].Topic {
			continue // a batch's rows mostly share a topic: looked at once
		}
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
