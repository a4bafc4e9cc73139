package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/outboxd/outboxd/outbox"
)

// Kafka is what GET /topics asks of the Kafka cluster the server uses. The
// server's wiring implements it; without one (no Kafka configured) the
// endpoints answer 404 with code no_kafka. Implementations must be safe
// for concurrent use and bound each call by ctx.
type Kafka interface {
	// Topics lists the cluster's topics, by name.
	Topics(ctx context.Context) ([]KafkaTopic, error)
	// Topic describes one topic with each partition's start and end
	// offsets, and the committed offsets of groups (those of the feeds
	// reading it are added by the implementation); an error wrapping
	// outbox.ErrNotFound when there is no such topic.
	Topic(ctx context.Context, name string, groups []string) (KafkaTopicDetail, error)
}

// KafkaTopic is one topic of a listing.
type KafkaTopic struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	Internal   bool   `json:"internal"`
	// Roles say what outboxd does with the topic: "input of FEED",
	// "outputs of FEED", ... (empty: none).
	Roles []string `json:"roles"`
}

// KafkaTopicDetail is one topic described.
type KafkaTopicDetail struct {
	Topic      string           `json:"topic"`
	Roles      []string         `json:"roles"`
	Partitions []KafkaPartition `json:"partitions"`
	// Groups are the consumer groups whose offsets are shown: the feeds'
	// reading the topic, and those asked for.
	Groups []string `json:"groups"`
}

// KafkaPartition is one partition: its leader broker, its first and next
// offsets (end is the high watermark; a transactional topic's last offset
// before it may be a transaction's marker, not a record, so a caught-up
// reader may show a lag of 1), and per group the committed offset (null when the
// group committed none) and the lag (end minus committed, or end minus
// start when none). Position is outboxd's own stored position of the
// feed reading it (the authority on what was applied), null for a topic
// no feed reads.
type KafkaPartition struct {
	Partition int32        `json:"partition"`
	Leader    int32        `json:"leader"`
	Start     int64        `json:"start"`
	End       int64        `json:"end"`
	Groups    []GroupLag   `json:"groups"`
	Positions []FeedOffset `json:"positions"`
}

// GroupLag is a group's committed offset on a partition and its lag.
type GroupLag struct {
	Group     string `json:"group"`
	Committed *int64 `json:"committed"`
	Lag       int64  `json:"lag"`
}

// FeedOffset is a feed's stored position on a partition and its lag.
type FeedOffset struct {
	Feed     string `json:"feed"`
	Position int64  `json:"position"`
	Lag      int64  `json:"lag"`
}

// TopicList is the body of GET /topics.
type TopicList struct {
	Topics []KafkaTopic `json:"topics"`
}

// CodeNoKafka: the server uses no Kafka, so it has no topics to show.
const CodeNoKafka = "no_kafka"

// kafkaTimeout bounds the Kafka requests of one answer.
const kafkaTimeout = 10 * time.Second

// maxGroups bounds the groups one describe asks for.
const maxGroups = 16

// SetKafka gives the server the cluster GET /topics reads. Call it before
// Open or Serve.
func (s *Server) SetKafka(k Kafka) { s.kafka = k }

// roles says what outboxd does with each topic: the feeds' inputs and
// outputs.
func (s *Server) roles() map[string][]string {
	out := map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(s.feeds)) {
		f := s.feeds[name]
		if f.Kind() == "kafka" {
			out[f.Source()] = append(out[f.Source()], "input of "+name)
		}
		if ft, ok := f.(FeedTopics); ok {
			for i, t := range ft.Topics() {
				what := "outputs of "
				switch {
				case strings.HasSuffix(t, ".dlq") && i > 0:
					what = "dead letters of "
				case strings.HasSuffix(t, ".retry") && i > 0:
					what = "retries of "
				}
				out[t] = append(out[t], what+name)
			}
		}
	}
	return out
}

// noKafka answers 404 no_kafka when the server has no cluster.
func (s *Server) noKafka(w http.ResponseWriter) bool {
	if s.kafka != nil {
		return false
	}
	writeError(w, http.StatusNotFound, CodeNoKafka, "this server uses no Kafka (--relay none and no Kafka feed): it has no topics")
	return true
}

// handleTopics serves GET /topics.
func (s *Server) handleTopics(w http.ResponseWriter, r *http.Request) {
	if s.noKafka(w) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), kafkaTimeout)
	defer cancel()
	ts, err := s.kafka.Topics(ctx)
	if err != nil {
		s.kafkaFailed(w, r, err)
		return
	}
	roles := s.roles()
	for i := range ts {
		ts[i].Roles = append([]string{}, roles[ts[i].Topic]...)
	}
	writeJSON(w, http.StatusOK, TopicList{Topics: ts})
}

// handleTopic serves GET /topics/{name}?group=G (repeatable).
func (s *Server) handleTopic(w http.ResponseWriter, r *http.Request) {
	if s.noKafka(w) {
		return
	}
	name := chi.URLParam(r, "name")
	groups := r.URL.Query()["group"]
	if len(groups) > maxGroups {
		writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("group: %d given, at most %d", len(groups), maxGroups))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), kafkaTimeout)
	defer cancel()
	d, err := s.kafka.Topic(ctx, name, groups)
	if errors.Is(err, outbox.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no topic %s", name))
		return
	}
	if err != nil {
		s.kafkaFailed(w, r, err)
		return
	}
	d.Roles = append([]string{}, s.roles()[name]...)
	if err := s.addPositions(ctx, &d); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// addPositions adds the stored positions of the feeds reading the topic.
func (s *Server) addPositions(ctx context.Context, d *KafkaTopicDetail) error {
	for _, name := range slices.Sorted(maps.Keys(s.feeds)) {
		f := s.feeds[name]
		if f.Kind() != "kafka" || f.Source() != d.Topic {
			continue
		}
		cps, err := s.store.ReadPositions(ctx, name)
		if err != nil {
			return err
		}
		for i := range d.Partitions {
			p := &d.Partitions[i]
			for _, c := range cps {
				if c.Partition == p.Partition {
					p.Positions = append(p.Positions, FeedOffset{Feed: name, Position: c.Position, Lag: max(p.End-c.Position, 0)})
				}
			}
		}
	}
	return nil
}

// kafkaFailed answers 502: Kafka did not answer, or refused.
func (s *Server) kafkaFailed(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Warn("reading Kafka's topics", logKeyPath, r.URL.Path, logKeyErr, err)
	writeError(w, http.StatusBadGateway, CodeKafka, "Kafka: "+err.Error())
}

// CodeKafka: Kafka did not answer in time, or refused the request.
const CodeKafka = "kafka"
