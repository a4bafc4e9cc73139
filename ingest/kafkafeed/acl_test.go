package kafkafeed_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/feedtest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/securekafka"
	"github.com/outboxd/outboxd/outbox"
)

const (
	feedUser     = "feed"
	feedPassword = "feed-secret"
	aclTopic     = "events"
	aclGroup     = "outboxd-events"
)

// secured is a kfake broker with TLS, SCRAM-SHA-256 and ACLs, a superuser
// "admin" and the feed's user "feed".
type secured struct{ *securekafka.Broker }

func startSecured(t *testing.T, grants ...kfake.ACL) *secured {
	t.Helper()
	return &secured{securekafka.Start(t, securekafka.Options{
		Mechanism: kafkasec.MechanismSCRAMSHA256, User: feedUser, Password: feedPassword, Grants: grants,
		Cluster:     []kfake.Opt{kfake.SeedTopics(2, aclTopic)},
		AdminClient: []kgo.Opt{kgo.RecordPartitioner(kgo.ManualPartitioner())},
	})}
}

// produce writes n records to each partition of the topic as the admin.
func (s *secured) produce(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p := int32(0); p < 2; p++ {
		for i := range n {
			r := &kgo.Record{Topic: aclTopic, Partition: p, Value: []byte(fmt.Sprintf("p%d-%d", p, i))}
			if err := s.AdminClient.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// lines is a log safe to read while written.
type lines = testutil.SyncBuffer

var acl = securekafka.ACL

func securedFeedConfig(t *testing.T, s *secured, password string, log *lines) kafkafeed.Config {
	return kafkafeed.Config{
		Brokers: []string{s.Addr}, Topic: aclTopic, Group: aclGroup,
		MetadataRefresh: 50 * time.Millisecond, CommitInterval: 50 * time.Millisecond,
		Kafka: s.Settings(t, feedUser, password), RefusedRetry: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

// waitTrouble waits until the feed's trouble holds want and stalls as
// said.
func waitTrouble(t *testing.T, f *kafkafeed.Feed, want string, stalls bool) {
	t.Helper()
	feedtest.Wait(t, feedtest.Timeout, func() error {
		msg, st := f.Trouble()
		if !strings.Contains(msg, want) || st != stalls {
			return fmt.Errorf("trouble %q (stalls %v), want %q (stalls %v)", msg, st, want, stalls)
		}
		return nil
	})
}

// collectAll reads every item of both partitions (n each), checks each
// came once, and returns the checkpoint after the last of each partition.
func collectAll(t *testing.T, f *kafkafeed.Feed, n int) []outbox.Checkpoint {
	t.Helper()
	seen := map[string]int{}
	last := map[int32]outbox.Checkpoint{}
	items := 0
	for items < 2*n {
		for _, r := range feedtest.Collect(t, f, 1, feedtest.Timeout) {
			if r.Kind == ingest.RecordItem {
				seen[string(r.Item.Value)]++
				items++
				last[r.Partition] = outbox.Checkpoint{Partition: r.Partition, Epoch: r.Epoch, Position: r.Position}
			}
		}
	}
	if len(seen) != 2*n {
		t.Fatalf("%d distinct items of %d read, want %d", len(seen), items, 2*n)
	}
	return []outbox.Checkpoint{last[0], last[1]}
}

// noItems checks the feed yields no item for a while (epochs may come:
// the topic's metadata is allowed).
func noItems(t *testing.T, f *kafkafeed.Feed) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), feedtest.Quiet)
	defer cancel()
	for ctx.Err() == nil {
		recs, _ := f.Poll(ctx, nil, 100)
		for _, r := range recs {
			if r.Kind == ingest.RecordItem {
				t.Fatalf("read %s while refused", feedtest.Describe(r))
			}
		}
	}
}

// Over TLS and SCRAM, with Read on its topic and group, the feed reads
// every record once and commits the group's offsets.
func TestFeed_Secured(t *testing.T) {
	s := startSecured(t, acl(kmsg.ACLResourceTypeTopic, aclTopic, kmsg.ACLOperationRead),
		acl(kmsg.ACLResourceTypeGroup, aclGroup, kmsg.ACLOperationRead))
	s.produce(t, 5)
	var log lines
	f := openKafkaFeed(t, securedFeedConfig(t, s, feedPassword, &log), nil)
	collectAll(t, f, 5)
	if msg, _ := f.Trouble(); msg != "" {
		t.Fatalf("trouble %q with every grant", msg)
	}
}

// Each missing grant is a trouble naming the principal, the operation and
// the resource, logged once; granted, the feed goes on by itself.
func TestFeed_MissingACL(t *testing.T) {
	readTopic := acl(kmsg.ACLResourceTypeTopic, aclTopic, kmsg.ACLOperationRead)
	readGroup := acl(kmsg.ACLResourceTypeGroup, aclGroup, kmsg.ACLOperationRead)
	cases := []struct {
		name   string
		grants []kfake.ACL
		want   string
		stalls bool
		grant  *kadm.ACLBuilder
	}{
		{"TopicNothing", []kfake.ACL{readGroup},
			`User:feed lacks Read on topic "events" (TOPIC_AUTHORIZATION_FAILED)`, true,
			kadm.NewACLs().Topics(aclTopic).Operations(kadm.OpRead)},
		{"TopicDescribeOnly", []kfake.ACL{readGroup, acl(kmsg.ACLResourceTypeTopic, aclTopic, kmsg.ACLOperationDescribe)},
			`User:feed lacks Read on topic "events" (TOPIC_AUTHORIZATION_FAILED)`, true,
			kadm.NewACLs().Topics(aclTopic).Operations(kadm.OpRead)},
		{"Group", []kfake.ACL{readTopic},
			`User:feed lacks Read on group "outboxd-events" (GROUP_AUTHORIZATION_FAILED)`, false,
			kadm.NewACLs().Groups(aclGroup).Operations(kadm.OpRead)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := startSecured(t, c.grants...)
			s.produce(t, 3)
			var log lines
			f := openKafkaFeed(t, securedFeedConfig(t, s, feedPassword, &log), nil)
			if c.stalls {
				waitTrouble(t, f, c.want, true)
				noItems(t, f)
			} else {
				cps := collectAll(t, f, 3)
				if err := f.Commit(context.Background(), cps); err != nil {
					t.Fatal(err)
				}
				waitTrouble(t, f, c.want, false)
			}
			feedtest.Wait(t, feedtest.Timeout, func() error {
				if got := log.Count("Kafka refused the feed"); got != 1 {
					return fmt.Errorf("%d log lines of the refusal, want 1", got)
				}
				return nil
			})
			s.Grant(t, c.grant)
			if c.stalls {
				collectAll(t, f, 3)
			}
			waitTrouble(t, f, "", false)
			if got := log.Count("Kafka refused the feed"); got != 1 {
				t.Fatalf("%d log lines of the refusal after it was granted, want 1", got)
			}
		})
	}
}

// A wrong password is one refusal: the trouble names the mechanism and
// the user, it is logged once, and each retry is one connection every
// RefusedRetry.
func TestFeed_WrongPassword(t *testing.T) {
	s := startSecured(t, acl(kmsg.ACLResourceTypeTopic, aclTopic, kmsg.ACLOperationRead))
	var log lines
	cfg := securedFeedConfig(t, s, "pw-Zq81x", &log)
	f := kafkafeed.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	opened := make(chan error, 1)
	go func() { opened <- f.Open(ctx, nil) }()
	waitTrouble(t, f, `SASL SCRAM-SHA-256 as "feed"`, true)
	start, n0 := time.Now(), s.Accepts.Load()
	feedtest.Wait(t, feedtest.Timeout, func() error {
		if n := s.Accepts.Load() - n0; n < 3 {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	})
	took, n := time.Since(start), s.Accepts.Load()-n0
	if most := int64(took/cfg.RefusedRetry) + 2; n > most {
		t.Fatalf("%d connections in %v, want at most %d", n, took, most)
	}
	if got := log.Count("Kafka refused the feed"); got != 1 {
		t.Fatalf("%d log lines of the refusal, want 1", got)
	}
	if msg, _ := f.Trouble(); log.Count("pw-Zq81x") > 0 || strings.Contains(msg, "pw-Zq81x") {
		t.Fatal("the password shows in the log or the trouble")
	}
	cancel()
	if err := <-opened; err == nil {
		t.Fatal("Open succeeded with a wrong password")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// A loop on a feed Kafka refuses reports the feed stalled with the
// refusal (the API's state and lastError); once granted, it applies every
// record once and moves again.
func TestFeed_LoopRefused(t *testing.T) {
	s := startSecured(t, acl(kmsg.ACLResourceTypeGroup, aclGroup, kmsg.ACLOperationRead))
	s.produce(t, 4)
	store, err := outbox.Open(context.Background(), outbox.DefaultConfig(filepath.Join(t.TempDir(), "o.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var applied sync.Map
	proc := ingest.ProcessorFunc(func(_ context.Context, _ *outbox.Tx, _ ingest.Delivery, item ingest.Item) error {
		n, _ := applied.LoadOrStore(string(item.Value), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return nil
	})
	var log lines
	cfg := ingest.DefaultConfig("events")
	l, err := ingest.NewLoop(store, kafkafeed.New(securedFeedConfig(t, s, feedPassword, &log)), proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	want := `not authorized: User:feed lacks Read on topic "events" (TOPIC_AUTHORIZATION_FAILED)`
	feedtest.Wait(t, feedtest.Timeout, func() error {
		if st, msg := l.State(); st != outbox.StateStalled || msg != want {
			return fmt.Errorf("state %s %q, want stalled %q", st, msg, want)
		}
		return nil
	})
	s.Grant(t, kadm.NewACLs().Topics(aclTopic).Operations(kadm.OpRead))
	feedtest.Wait(t, feedtest.Timeout, func() error {
		if st, msg := l.State(); st != outbox.StateCaughtUp || msg != "" {
			return fmt.Errorf("state %s %q, want caught-up", st, msg)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	count := 0
	applied.Range(func(k, v any) bool {
		if n := v.(*atomic.Int64).Load(); n != 1 {
			t.Errorf("%s applied %d times", k, n)
		}
		count++
		return true
	})
	if count != 8 {
		t.Fatalf("%d records applied, want 8", count)
	}
}
