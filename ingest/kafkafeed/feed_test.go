package kafkafeed_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/feedtest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/outbox"
)

// openKafkaFeed opens a feed on cfg from the checkpoints; it is closed at
// the end of t.
func openKafkaFeed(t *testing.T, cfg kafkafeed.Config, from map[int32]outbox.Checkpoint) *kafkafeed.Feed {
	t.Helper()
	f := kafkafeed.New(cfg)
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), feedtest.Timeout)
	defer cancel()
	if err := f.Open(ctx, from); err != nil {
		t.Fatal(err)
	}
	return f
}

func admin(t *testing.T, c *kfake.Cluster) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

func values(prefix string, n int) [][]byte {
	vs := make([][]byte, n)
	for i := range vs {
		vs[i] = []byte(fmt.Sprintf("%s-%d", prefix, i))
	}
	return vs
}

// byPartition splits records by partition.
func byPartition(recs []ingest.Record) map[int32][]ingest.Record {
	m := map[int32][]ingest.Record{}
	for _, r := range recs {
		m[r.Partition] = append(m[r.Partition], r)
	}
	return m
}

func TestFeed_Partitions(t *testing.T) {
	c := newKafka(t)
	const topic = "parts"
	if err := c.CreateTopic(topic, 2, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, c, topic, 0, values("p0", 3)...)
	produce(t, c, topic, 1, values("p1", 2)...)
	f := openKafkaFeed(t, testKafkaConfig(t, c, topic), nil)
	got := byPartition(feedtest.Collect(t, f, 2+3+2, feedtest.Timeout))
	topicID, _, _ := strings.Cut(got[0][0].Epoch, ":")
	for p, n := range map[int32]int{0: 3, 1: 2} {
		recs := got[p]
		if len(recs) != n+1 || recs[0].Kind != ingest.RecordEpoch || recs[0].Position != 0 {
			t.Fatalf("partition %d: %s, want an epoch at 0 then %d items", p, feedtest.DescribeAll(recs), n)
		}
		if want := kafkafeed.Epoch(topicID, p); recs[0].Epoch != want || len(topicID) != 22 {
			t.Errorf("partition %d: epoch %q, want %q (the topic's ID, then the partition)", p, recs[0].Epoch, want)
		}
		for i, r := range recs[1:] {
			if r.Epoch != recs[0].Epoch || r.Position != int64(i+1) || string(r.Item.Key) != "k" {
				t.Errorf("partition %d: record %d is %s, want position %d", p, i, feedtest.Describe(r), i+1)
			}
		}
	}

	t.Run("AddedLater", func(t *testing.T) {
		if _, err := admin(t, c).CreatePartitions(context.Background(), 1, topic); err != nil {
			t.Fatal(err)
		}
		produce(t, c, topic, 2, values("p2", 2)...)
		recs := feedtest.Collect(t, f, 3, feedtest.Timeout)
		if recs[0].Kind != ingest.RecordEpoch || recs[0].Partition != 2 {
			t.Fatalf("got %s, want an epoch of partition 2 first", feedtest.DescribeAll(recs))
		}
		feedtest.NoMore(t, f, feedtest.Quiet)
		feedtest.Wait(t, feedtest.Timeout, func() error {
			ends := f.Ends()
			if ends[0] != 3 || ends[1] != 2 || ends[2] != 2 {
				return fmt.Errorf("ends %v, want 0:3 1:2 2:2", ends)
			}
			return nil
		})
	})
}

func TestFeed_MissingTopicAppears(t *testing.T) {
	c := newKafka(t)
	f := openKafkaFeed(t, testKafkaConfig(t, c, "later"), nil)
	feedtest.NoMore(t, f, feedtest.Quiet)
	if err := c.CreateTopic("later", 1, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, c, "later", 0, []byte("v"))
	recs := feedtest.Collect(t, f, 2, feedtest.Timeout)
	if recs[0].Kind != ingest.RecordEpoch || recs[1].Position != 1 {
		t.Fatalf("got %s, want an epoch then the item at 1", feedtest.DescribeAll(recs))
	}
}

func TestFeed_RetentionGap(t *testing.T) {
	c := newKafka(t)
	const topic = "gap"
	if err := c.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, c, topic, 0, values("v", 10)...)
	cfg := testKafkaConfig(t, c, topic)
	first := feedtest.Collect(t, openKafkaFeed(t, cfg, nil), 3, feedtest.Timeout)
	cp := outbox.Checkpoint{Partition: 0, Epoch: first[0].Epoch, Position: first[2].Position, End: 10}

	t.Run("WhileStopped", func(t *testing.T) {
		if err := c.DeleteRecords(topic, 0, 6); err != nil {
			t.Fatal(err)
		}
		f := openKafkaFeed(t, cfg, map[int32]outbox.Checkpoint{0: cp})
		recs := feedtest.Collect(t, f, 1+4, feedtest.Timeout)
		loss := recs[0]
		if loss.Kind != ingest.RecordLoss || loss.Epoch != cp.Epoch || loss.From != 2 || loss.To != 6 || loss.Reason != kafkafeed.LossRetention {
			t.Fatalf("first record %s, want a retention loss 2..6 of %q", feedtest.Describe(loss), cp.Epoch)
		}
		feedtest.CheckItems(t, cp.Epoch, recs[1:], values("v", 10)[6:])
	})

	t.Run("WhileRunning", func(t *testing.T) {
		// The feed reads what it can hold unpolled and its consumer then
		// waits; meanwhile the log start passes it.
		// more is many fetch responses (64 KiB each) beyond what the
		// consumer can hold, so the deletion surely passes unread records.
		const held, more = 6000, 60_000
		produce(t, c, topic, 0, values("w", held)...)
		f := openKafkaFeed(t, cfg, map[int32]outbox.Checkpoint{0: {Epoch: cp.Epoch, Position: 10}})
		end := int64(10 + held + more)
		feedtest.Wait(t, feedtest.Timeout, func() error {
			if got := f.Ends()[0]; got != 10+held {
				return fmt.Errorf("end %d, want %d: not fetched yet", got, 10+held)
			}
			return nil
		})
		produce(t, c, topic, 0, values("x", more)...)
		if err := c.DeleteRecords(topic, 0, end-500); err != nil {
			t.Fatal(err)
		}
		if losses := checkCovered(t, f, cp.Epoch, 10, end); losses != 1 {
			t.Fatalf("%d losses, want 1", losses)
		}
	})
}

// checkCovered polls f until position end and checks that every position
// from start is either an item's or in a loss, once, in order. It returns
// the number of losses.
func checkCovered(t *testing.T, f ingest.Feed, epoch string, start, end int64) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), feedtest.Timeout)
	defer cancel()
	pos, losses := start, 0
	for pos < end {
		recs, err := f.Poll(ctx, nil, 1000)
		if err != nil {
			t.Fatalf("at %d: %v", pos, err)
		}
		for _, r := range recs {
			switch {
			case r.Epoch != epoch:
				t.Fatalf("at %d: %s of another epoch", pos, feedtest.Describe(r))
			case r.Kind == ingest.RecordLoss && r.From == pos && r.To > pos && r.Reason == kafkafeed.LossRetention:
				t.Logf("lost %d..%d", r.From, r.To)
				pos, losses = r.To, losses+1
			case r.Kind == ingest.RecordItem && r.Position == pos+1:
				pos++
			default:
				t.Fatalf("at %d: unexpected %s", pos, feedtest.Describe(r))
			}
		}
	}
	return losses
}

func TestFeed_ExtraTopicHold(t *testing.T) {
	c := newKafka(t)
	for _, tp := range []string{"main", "main.retry"} {
		if err := c.CreateTopic(tp, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testKafkaConfig(t, c, "main")
	cfg.Topics = []string{"main.retry"}
	hold := 600 * time.Millisecond
	due := time.UnixMilli(time.Now().Add(hold).UnixMilli()) // as the header holds it
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	dueHeader := kgo.RecordHeader{Key: ingest.HeaderRetryDue, Value: []byte(strconv.FormatInt(due.UnixMilli(), 10))}
	err = cl.ProduceSync(context.Background(),
		&kgo.Record{Topic: "main.retry", Value: []byte("held"), Headers: []kgo.RecordHeader{dueHeader}},
		&kgo.Record{Topic: "main.retry", Value: []byte("behind")},
		&kgo.Record{Topic: "main", Value: []byte("main"), Headers: []kgo.RecordHeader{dueHeader}},
	).FirstErr()
	if err != nil {
		t.Fatal(err)
	}
	f := openKafkaFeed(t, cfg, nil)
	early := byPartition(feedtest.Collect(t, f, 3, feedtest.Timeout)) // two epochs and "main"
	retryPart := kafkafeed.FeedPartition(1, 0)
	if len(early[0]) != 2 || string(early[0][1].Item.Value) != "main" || len(early[retryPart]) != 1 {
		t.Fatalf("before the due time got %v, want main's epoch and item, and the retry topic's epoch", early)
	}
	late := feedtest.Collect(t, f, 2, feedtest.Timeout)
	if now := time.Now(); now.Before(due) {
		t.Fatalf("held record yielded %v before its due time", due.Sub(now))
	}
	for i, want := range []string{"held", "behind"} {
		if late[i].Partition != retryPart || string(late[i].Item.Value) != want || late[i].Position != int64(i+1) {
			t.Errorf("record %d is %s of partition %d, want %q of %d", i, feedtest.Describe(late[i]), late[i].Partition, want, retryPart)
		}
	}
	if ti, p := kafkafeed.TopicPartition(retryPart); ti != 1 || p != 0 {
		t.Errorf("TopicPartition(%d) = %d, %d; want 1, 0", retryPart, ti, p)
	}
}

func TestFeed_CommitsGroupOffsets(t *testing.T) {
	c := newKafka(t)
	if err := c.CreateTopic("g", 1, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, c, "g", 0, values("v", 5)...)
	cfg := testKafkaConfig(t, c, "g")
	f := openKafkaFeed(t, cfg, nil)
	recs := feedtest.Collect(t, f, 6, feedtest.Timeout)
	cps := []outbox.Checkpoint{{Partition: 0, Epoch: recs[0].Epoch, Position: 4}}
	if err := f.Commit(context.Background(), cps); err != nil {
		t.Fatal(err)
	}
	adm := admin(t, c)
	feedtest.Wait(t, feedtest.Timeout, func() error {
		offs, err := adm.FetchOffsets(context.Background(), cfg.Group)
		if err != nil {
			return err
		}
		o, ok := offs.Lookup("g", 0)
		if !ok || o.At != 4 {
			return fmt.Errorf("group offset %+v, want 4", o)
		}
		return nil
	})
	// A checkpoint of another epoch is not committed.
	if err := f.Commit(context.Background(), []outbox.Checkpoint{{Partition: 0, Epoch: "other:0", Position: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Commit(context.Background(), []outbox.Checkpoint{{Partition: 0, Epoch: recs[0].Epoch, Position: 5}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil { // flushes
		t.Fatal(err)
	}
	offs, err := adm.FetchOffsets(context.Background(), cfg.Group)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := offs.Lookup("g", 0); o.At != 5 {
		t.Fatalf("group offset after close %+v, want 5", o)
	}
}

func TestFeed_Lifecycle(t *testing.T) {
	c := newKafka(t)
	t.Run("BadConfig", func(t *testing.T) {
		for _, cfg := range []kafkafeed.Config{
			{Topic: "t"},
			{Brokers: c.ListenAddrs()},
			{Brokers: c.ListenAddrs(), Topic: "t", Topics: []string{"t"}},
		} {
			if err := kafkafeed.New(cfg).Open(context.Background(), nil); err == nil {
				t.Errorf("Open with %+v: no error", cfg)
			}
		}
	})
	t.Run("CloseWakesPoll", func(t *testing.T) {
		f := openKafkaFeed(t, testKafkaConfig(t, c, "none"), nil)
		time.AfterFunc(100*time.Millisecond, func() { f.Close() })
		_, err := f.Poll(context.Background(), nil, 1)
		if !errors.Is(err, fs.ErrClosed) {
			t.Fatalf("Poll after Close: %v, want fs.ErrClosed", err)
		}
	})
	t.Run("OpenTwice", func(t *testing.T) {
		f := openKafkaFeed(t, testKafkaConfig(t, c, "none"), nil)
		if err := f.Open(context.Background(), nil); err == nil {
			t.Fatal("second Open: no error")
		}
	})
}

// TestKafkaFeed_TransactionalEnd reads a topic written in transactions, one
// committed and one aborted: only the committed records are items, and the
// partition's end becomes its position once read, markers notwithstanding.
func TestFeed_TransactionalEnd(t *testing.T) {
	c := newKafka(t)
	for _, tp := range []string{"tx", "tx.retry"} {
		if err := c.CreateTopic(tp, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("test-tx"),
		kgo.DefaultProduceTopic("tx.retry"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for _, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort, kgo.TryCommit} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values(fmt.Sprint(commit), 2) {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: v}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testKafkaConfig(t, c, "tx")
	cfg.Topics = []string{"tx.retry"}
	f := openKafkaFeed(t, cfg, nil)
	recs := byPartition(feedtest.Collect(t, f, 2+4, feedtest.Timeout))
	retry := recs[kafkafeed.FeedPartition(1, 0)]
	if len(retry) != 5 {
		t.Fatalf("retry topic: %s, want an epoch and the 4 committed records", feedtest.DescribeAll(retry))
	}
	last := retry[4].Position // 2 records + marker + 2 aborted + marker, then these 2
	if last != 8 {
		t.Fatalf("last committed record at %d, want 8", last)
	}
	feedtest.NoMore(t, f, feedtest.Quiet)
	feedtest.Wait(t, feedtest.Timeout, func() error {
		if end := f.Ends()[kafkafeed.FeedPartition(1, 0)]; end != last {
			return fmt.Errorf("end %d, want the position %d (only a marker follows)", end, last)
		}
		return nil
	})
}

// TestFeed_RecordsBiggerThanAFetch checks records many times the size a
// fetch asks of a partition are read whole, in order, between small ones:
// each makes the fetch grow until it fits, and the next one is small again.
func TestFeed_RecordsBiggerThanAFetch(t *testing.T) {
	c := newKafka(t)
	const topic = "big"
	if err := c.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	for i, size := range []int{10, 100 << 10, 20, 300 << 10, 900 << 10, 30, 70 << 10, 5} {
		v := bytes.Repeat([]byte{byte('a' + i)}, size)
		v[size-1] = '.' // the last byte is there too
		want = append(want, v)
	}
	for _, v := range want { // one record a batch: none is cut by a batch limit
		produce(t, c, topic, 0, v)
	}
	f := openKafkaFeed(t, testKafkaConfig(t, c, topic), nil)
	recs := feedtest.Collect(t, f, 1+len(want), feedtest.Timeout)
	if recs[0].Kind != ingest.RecordEpoch {
		t.Fatalf("first record %s, want the epoch", feedtest.Describe(recs[0]))
	}
	feedtest.CheckItems(t, recs[0].Epoch, recs[1:], want)
	feedtest.NoMore(t, f, feedtest.Quiet)
}
