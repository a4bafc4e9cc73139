package tests

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// clusterParts is the number of partitions of the cluster test's feed.
const clusterParts = 12

// clusterServer is one of the cluster test's server slots: the process
// running in it now, and its incarnation (each start has a server id of its
// own, so a partition taken back by a restarted slot counts as moved).
type clusterServer struct {
	slot, incarnation int
	p                 *proc
	args              []string
}

func (cs *clusterServer) id() string { return fmt.Sprintf("s%d-%d", cs.slot, cs.incarnation) }

func (cs *clusterServer) start(t *testing.T) {
	cs.incarnation++
	cs.p = start(t, nil, append(slices.Clone(cs.args), "--server-id", cs.id())...)
}

// exited reports whether the slot's process has ended.
func (cs *clusterServer) exited() bool {
	select {
	case <-cs.p.done:
		return true
	default:
		return false
	}
}

// partitionOf is the partition of an account's lines: one per account, so
// an account's outputs keep their order.
func partitionOf(acct string) int32 {
	h := fnv.New32a()
	h.Write([]byte(acct))
	return int32(h.Sum32() % clusterParts)
}

// produceLedger writes lf's lines to topic over about d, each account's to
// its partition, and returns how many records each partition got.
func produceLedger(t *testing.T, broker, topic string, lf ledgerFile, d time.Duration) (<-chan map[int32]int64, func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(lf.data), "\n"), "\n")
	done := make(chan map[int32]int64, 1)
	stop := make(chan struct{})
	go func() {
		defer cl.Close()
		counts := map[int32]int64{}
		const chunk = 200
		pause := d / time.Duration((len(lines)+chunk-1)/chunk)
		for i := 0; i < len(lines); i += chunk {
			var recs []*kgo.Record
			for j, line := range lines[i:min(i+chunk, len(lines))] {
				line = strings.TrimSuffix(line, "\r")
				p := int32((i + j) % clusterParts)
				key := "bad"
				if e, err := ledger.Parse([]byte(line)); err == nil {
					key, p = e.Account, partitionOf(e.Account)
				}
				counts[p]++
				recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(key), Value: []byte(line)})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := cl.ProduceSync(ctx, recs...).FirstErr()
			cancel()
			if err != nil {
				t.Errorf("produce: %v", err)
				done <- counts
				return
			}
			select {
			case <-time.After(pause):
			case <-stop:
				pause = 0
			}
		}
		done <- counts
	}()
	var once sync.Once
	return done, func() { once.Do(func() { close(stop) }) }
}

// ownedBy returns the partitions of feed "ledger" owner holds, with their
// positions, from the store.
func ownedBy(t *testing.T, s *outbox.Store, owner string) map[int32]int64 {
	t.Helper()
	ctx := context.Background()
	owners, err := s.PartitionOwners(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	cps, err := s.Positions(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	m := map[int32]int64{}
	for _, o := range owners {
		if o.Owner == owner {
			m[o.Partition] = cps[o.Partition].Position
		}
	}
	return m
}

// waitMoved waits until every partition of from has another owner and a
// position past the one it had, and returns how long that took from since.
func waitMoved(t *testing.T, s *outbox.Store, victim string, from map[int32]int64, since time.Time) time.Duration {
	t.Helper()
	ctx := context.Background()
	wait(t, 120*time.Second, func() error {
		owners, err := s.PartitionOwners(ctx, "ledger")
		if err != nil {
			return err
		}
		cps, err := s.Positions(ctx, "ledger")
		if err != nil {
			return err
		}
		for _, o := range owners {
			pos, ok := from[o.Partition]
			if !ok {
				continue
			}
			if o.Owner == victim || o.Owner == "" || cps[o.Partition].Position <= pos {
				return fmt.Errorf("partition %d: owner %q at %d, was %s's at %d", o.Partition, o.Owner,
					cps[o.Partition].Position, victim, pos)
			}
		}
		return nil
	})
	return time.Since(since)
}

// percentile is the p-th percentile (0..100) of ds, nearest rank.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	return s[max(i-1, 0)]
}

// TestCluster_Failover is the cluster's end-to-end test with the built
// binary: three servers on one PostgreSQL database share a Kafka feed of 12
// partitions (--kafka-group) of ledger lines ("orders" of accounts, each
// account keyed to one partition) produced while random servers are killed
// -9 or stopped (SIGSTOP) for longer than the group's session timeout, then
// continued (SIGCONT: the server drops its batch in hand, fenced, and
// goes on; no server that was not killed may exit). Every failover is timed, from the fault to every partition the
// server held moving forward under another owner. At the end every line's
// output is on ledger.out once for a read_committed reader (every malformed
// line on ledger.dlq once), each account's running balance and final
// balance exact in the outputs and the store, nothing replayed, and the
// feed lossless.
func TestCluster_Failover(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster's kill -9 and SIGSTOP run takes minutes")
	}
	db := pgtest.New(t).DSN
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 25))
	t.Logf("seed %d", seed)
	orders, faults := 100_000, 10
	if n, err := strconv.Atoi(os.Getenv("CLUSTER_TEST_FAULTS")); err == nil && n > 0 {
		faults = n // 30 for the full run
	}
	lf := makeLedger(rng, orders)
	broker := startBroker(t)
	const topic = "ledger.in"
	adm, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := kadm.NewClient(adm).CreateTopic(context.Background(), clusterParts, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	args := []string{"--db", db, "--feed", "ledger=kafka:" + topic, "--processor", "ledger=ledger",
		"--kafka-group", "ledger=outboxd-ledger", "--http", "127.0.0.1:0", "--brokers", broker}
	servers := make([]*clusterServer, 3)
	for i := range servers {
		servers[i] = &clusterServer{slot: i + 1, args: args}
		servers[i].start(t)
	}
	s := readStore(t, db)
	// A fault every few seconds, the input produced meanwhile.
	session := kafkafeed.DefaultSessionTimeout
	produced, hurry := produceLedger(t, broker, topic, lf, time.Duration(faults)*(session+6*time.Second))
	defer hurry()

	var failovers []time.Duration
	// exits counts the servers that exited without being killed (a batch
	// fenced must not end a server): each is started again so that the
	// run's exactness checks go on, and the test fails at the end.
	exits := 0
	for i := range faults {
		// Wait for the cluster to have its three servers holding partitions.
		wait(t, 120*time.Second, func() error {
			n := 0
			for _, cs := range servers {
				if cs.exited() {
					exits++
					t.Logf("%s exited without being killed (%v): started again", cs.id(), cs.p.err)
					cs.start(t)
				}
				if len(ownedBy(t, s, cs.id())) > 0 {
					n++
				}
			}
			if n < len(servers) {
				return fmt.Errorf("%d of %d servers hold partitions", n, len(servers))
			}
			return nil
		})
		victim := servers[rng.IntN(len(servers))]
		held := ownedBy(t, s, victim.id())
		kill := rng.IntN(2) == 0
		at := time.Now()
		if kill {
			victim.p.kill()
		} else {
			victim.p.cmd.Process.Signal(syscall.SIGSTOP)
		}
		took := waitMoved(t, s, victim.id(), held, at)
		failovers = append(failovers, took)
		what := fmt.Sprintf("kill -9 of %s (%d partitions): moved on in %v", victim.id(), len(held), took.Round(time.Millisecond))
		if !kill {
			what = fmt.Sprintf("SIGSTOP of %s (%d partitions): moved on in %v", victim.id(), len(held), took.Round(time.Millisecond))
			if rest := session + 2*time.Second - time.Since(at); rest > 0 {
				time.Sleep(rest) // the fault itself: stopped past its session
			}
			victim.p.cmd.Process.Signal(syscall.SIGCONT)
			// Its batch in hand is fenced (refused, dropped): it goes on
			// and rejoins the group.
			wait(t, 60*time.Second, func() error {
				if victim.exited() || len(ownedBy(t, s, victim.id())) > 0 {
					return nil
				}
				return fmt.Errorf("%s neither exited nor holds a partition again", victim.id())
			})
			if victim.exited() {
				exits++
				what += fmt.Sprintf("; continued, it EXITED (%v): started again", victim.p.err)
				victim.start(t)
			} else {
				what += "; continued, it rejoined"
			}
		}
		t.Logf("fault %d: %s", i+1, what)
		if kill {
			victim.start(t)
		}
	}
	hurry()
	counts := <-produced
	for _, cs := range servers {
		if cs.exited() {
			exits++
			t.Logf("%s exited without being killed (%v): started again", cs.id(), cs.p.err)
			cs.start(t)
		}
	}
	if exits != 0 {
		t.Errorf("%d exits of servers that were not killed, want 0 (a fenced batch must not end a server)", exits)
	}
	wait(t, 180*time.Second, func() error {
		cps, err := s.Positions(context.Background(), "ledger")
		if err != nil {
			return err
		}
		for p := range int32(clusterParts) {
			if cps[p].Position != counts[p] {
				return fmt.Errorf("partition %d at %d, want %d", p, cps[p].Position, counts[p])
			}
		}
		return relayDone(context.Background(), s)
	})
	for _, cs := range servers {
		if code := cs.p.stop(t, 60*time.Second); code != 0 {
			t.Errorf("%s: exit code %d after SIGTERM, want 0", cs.id(), code)
		}
	}
	t.Logf("failover over %d faults (session timeout %v): p50 %v, p99 %v, max %v", len(failovers), session,
		percentile(failovers, 50).Round(time.Millisecond), percentile(failovers, 99).Round(time.Millisecond),
		slices.Max(failovers).Round(time.Millisecond))

	got := readAll(t, broker, "ledger.out", "ledger.dlq")
	repeats := 0
	out := dedupe(t, got["ledger.out"], &repeats)
	dlq := dedupe(t, got["ledger.dlq"], &repeats)
	if repeats != 0 || len(out) != len(lf.valid) || len(dlq) != len(lf.malformed) {
		t.Fatalf("%d outputs, %d dead letters, %d repeated: want %d, %d, none", len(out), len(dlq), repeats,
			len(lf.valid), len(lf.malformed))
	}
	checkBalances(t, out, lf)
	ctx := context.Background()
	bal, err := ledger.Balances(ctx, s, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if !equalBalances(bal, lf.balances) {
		t.Fatalf("stored balances differ from the lines' sums:\n got %v\nwant %v", bal, lf.balances)
	}
	f, err := s.Feed(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if f.Applied != int64(len(lf.valid)) || f.DeadLettered != int64(len(lf.malformed)) || f.ReplaysSkipped != 0 ||
		!f.Lossless || f.CompletionFailures != 0 {
		t.Fatalf("stats %+v: want applied %d, deadLettered %d, no replays, lossless", f, len(lf.valid), len(lf.malformed))
	}
}
