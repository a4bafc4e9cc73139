package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/outbox"
)

// The topics API lists the cluster's topics and describes one: each
// partition's leader, start and end, and a group's committed offsets and
// lag, as an independent franz-go client wrote them.
func TestKafkaTopics_ListAndDescribe(t *testing.T) {
	broker := kcatCluster(t)
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 5 {
		r := &kgo.Record{Partition: int32(i % 2), Value: []byte("v")}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: 1, LeaderEpoch: -1})
	if _, err := adm.CommitOffsets(ctx, "g", offs); err != nil {
		t.Fatal(err)
	}
	k := kafkaTopics{brokers: []string{broker}, groups: map[string][]string{"t": {"g"}}}
	list, err := k.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(list); got != fmt.Sprint([]api.KafkaTopic{{Topic: "t", Partitions: 3}}) {
		t.Fatalf("topics: %s", got)
	}
	d, err := k.Topic(ctx, "t", []string{"other"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range d.Partitions {
		s := fmt.Sprintf("%d:%d-%d", p.Partition, p.Start, p.End)
		for _, g := range p.Groups {
			c := "-"
			if g.Committed != nil {
				c = fmt.Sprint(*g.Committed)
			}
			s += fmt.Sprintf(" %s@%s lag %d", g.Group, c, g.Lag)
		}
		got = append(got, s)
	}
	want := "[0:0-3 g@1 lag 2 other@- lag 3 1:0-2 g@- lag 2 other@- lag 2 2:0-0 g@- lag 0 other@- lag 0]"
	if fmt.Sprint(got) != want || fmt.Sprint(d.Groups) != "[g other]" {
		t.Fatalf("topic t: %v groups %v\nwant %s", got, d.Groups, want)
	}
	if _, err := k.Topic(ctx, "missing", nil); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("a missing topic: %v, want outbox.ErrNotFound", err)
	}
}
