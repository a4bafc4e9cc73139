package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/kafkafeed"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// An order's life, in the order its events happen.
var orderLife = []string{"placed", "paid", "shipped", "delivered"}

// orderEvent is one record to produce to orders.events.
type orderEvent struct {
	key, value string
	slot       float64 // where it falls in the production order
}

// orderChange is a status change as the status topic carries it.
type orderChange struct {
	Status, Previous string
	At               time.Time
}

func (c orderChange) String() string {
	return fmt.Sprintf("%s>%s@%s", c.Previous, c.Status, c.At.Format(time.RFC3339))
}

// ordersRun is the input of an orders test and what applying it exactly
// once must give.
type ordersRun struct {
	events  []orderEvent             // in production order
	changes map[string][]orderChange // per order, in order
	final   map[string]orders.Status // per order with a status
	dead    map[string]string        // dead letter value -> reason
	seq     int                      // makes every value distinct
}

// makeOrders builds the events of n orders, produced in a shuffled but
// mostly ordered way: orders interleave; about 15% have one adjacent pair
// of events swapped (the later event first: refused, retried, applied once
// the earlier one is); 5% hold an event no order can take (dead-lettered as
// invalid-transition once its retries are spent); 5% have an event sent
// twice (the second changes nothing); and about 1% of all records are
// malformed or of an unknown type. Orders with a swapped pair are never
// cancelled, so whatever the timing of their retries each event ends last
// in its order's history, and the changes are those of the events in order.
func makeOrders(rng *rand.Rand, n int) *ordersRun {
	run := &ordersRun{changes: map[string][]orderChange{}, final: map[string]orders.Status{}, dead: map[string]string{}}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	span := float64(n) // orders start over this many slots, events one slot apart
	for i := range n {
		id := fmt.Sprintf("o-%05d", i)
		at := func(k int) time.Time { return base.Add(time.Duration(i)*time.Second + time.Duration(k)*time.Minute) }
		start := rng.Float64() * span
		var seq []string // event types, in the order they happen
		var arrival []int
		extra := ""
		switch r := rng.IntN(100); {
		case r < 15: // cancelled
			seq = append(slices.Clone(orderLife[:1+rng.IntN(2)]), "cancelled")
		case r < 30: // a swapped pair
			seq = slices.Clone(orderLife[:2+rng.IntN(3)])
			arrival = swapOne(rng, len(seq))
		case r < 33: // an event that never fits, after a life that ended
			seq = append(slices.Clone(orderLife[:1]), "cancelled")
			extra = "shipped"
		case r < 35: // paid, never placed
			extra = "paid"
		case r < 40: // one event sent twice
			seq = slices.Clone(orderLife[:1+rng.IntN(4)])
			arrival = make([]int, 0, len(seq)+1)
			dup := rng.IntN(len(seq))
			for k := range seq {
				arrival = append(arrival, k)
				if k == dup {
					arrival = append(arrival, k)
				}
			}
		default:
			seq = slices.Clone(orderLife[:1+rng.IntN(4)])
		}
		if arrival == nil {
			arrival = make([]int, len(seq))
			for k := range arrival {
				arrival[k] = k
			}
		}
		prev := ""
		for k, typ := range seq {
			run.changes[id] = append(run.changes[id], orderChange{Status: typ, Previous: prev, At: at(k)})
			run.final[id] = orders.Status(typ)
			prev = typ
		}
		for j, k := range arrival {
			run.add(id, seq[k], at(k), start+float64(j)+rng.Float64()*0.5)
		}
		if extra != "" {
			v := run.add(id, extra, at(len(seq)+1), start+float64(len(arrival))+rng.Float64()*0.5)
			run.dead[v] = orders.ReasonInvalidTransition
		}
	}
	run.addBad(rng, n/100, span)
	sort.SliceStable(run.events, func(a, b int) bool { return run.events[a].slot < run.events[b].slot })
	return run
}

// swapOne returns 0..n-1 with one adjacent pair swapped.
func swapOne(rng *rand.Rand, n int) []int {
	a := make([]int, n)
	for k := range a {
		a[k] = k
	}
	k := rng.IntN(n - 1)
	a[k], a[k+1] = a[k+1], a[k]
	return a
}

// add appends an event of order id and returns its value.
func (run *ordersRun) add(id, typ string, at time.Time, slot float64) string {
	run.seq++
	v := fmt.Sprintf(`{"type":%q,"at":%q,"seq":%d}`, typ, at.Format(time.RFC3339), run.seq)
	run.events = append(run.events, orderEvent{key: id, value: v, slot: slot})
	return v
}

// addBad appends n records the processor dead-letters at once, of each kind.
func (run *ordersRun) addBad(rng *rand.Rand, n int, span float64) {
	for i := range n {
		run.seq++
		key, v, reason := fmt.Sprintf("o-%05d", rng.IntN(1000)), "", orders.ReasonMalformed
		switch i % 5 {
		case 0:
			key, v = "", fmt.Sprintf(`{"type":"placed","at":"2026-01-01T00:00:00Z","seq":%d}`, run.seq)
		case 1:
			v = fmt.Sprintf(`not json %d`, run.seq)
		case 2:
			v = fmt.Sprintf(`{"at":"2026-01-01T00:00:00Z","seq":%d}`, run.seq)
		case 3:
			v = fmt.Sprintf(`{"type":"paid","seq":%d}`, run.seq)
		case 4:
			v, reason = fmt.Sprintf(`{"type":"refunded","at":"2026-01-01T00:00:00Z","seq":%d}`, run.seq), orders.ReasonUnknownType
		}
		run.events = append(run.events, orderEvent{key: key, value: v, slot: rng.Float64() * span})
		run.dead[v] = reason
	}
}

// produceOrders produces events in order, keyed (so an order's events share
// a partition), pacing them over about d.
func produceOrders(t *testing.T, broker string, events []orderEvent, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic("orders.events"))
	if err != nil {
		t.Fatal(err)
	}
	const chunks = 100
	go func() {
		defer close(done)
		defer cl.Close()
		size := (len(events) + chunks - 1) / chunks
		for len(events) > 0 {
			n := min(size, len(events))
			recs := make([]*kgo.Record, n)
			for i, e := range events[:n] {
				recs[i] = &kgo.Record{Value: []byte(e.value)}
				if e.key != "" {
					recs[i].Key = []byte(e.key)
				}
			}
			if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
				t.Error(err)
				return
			}
			events = events[n:]
			time.Sleep(d / chunks) // pacing the producer, not waiting for a condition
		}
	}()
	return done
}

func createTopic(t *testing.T, broker, topic string, partitions int32) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(context.Background(), partitions, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	return adm
}

func TestOrders_KillNine(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	broker := startBroker(t)
	createTopic(t, broker, "orders.events", 3)
	run := makeOrders(rng, 20_000)
	db := filepath.Join(t.TempDir(), "outboxd.db")
	args := []string{"--db", db, "--feed", "orders=kafka:orders.events", "--processor", "orders=orders",
		"--brokers", broker, "--http", "127.0.0.1:0"}

	t0 := time.Now()
	producing := produceOrders(t, broker, run.events, 8*time.Second)
	kills := 0
	for kills < 22 {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(100+rng.IntN(500)) * time.Millisecond) // a random moment to crash at
		p.kill()
		kills++
	}
	<-producing
	t.Logf("%d kill -9s while %d records were produced (%v)", kills, len(run.events), time.Since(t0))

	p := start(t, nil, args...)
	waitRunning(t, p)
	retries := waitOrders(t, db, run)
	t.Logf("all applied and published (%v)", time.Since(t0))
	checkOrderStatusAPI(t, p, db)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	checkOrderTopics(t, broker, run, retries)
	checkOrderCounters(t, db, run, retries)
}

// waitOrders waits until every order has its final status, every dead letter
// is stored, every retry sent has come back and the relay has published
// everything. It returns the number of retries sent.
func waitOrders(t *testing.T, db string, run *ordersRun) int64 {
	t.Helper()
	s := readStore(t, db)
	ctx := context.Background()
	var retries int64
	wait(t, 75*time.Second, func() error {
		f, err := s.Feed(ctx, "orders")
		if err != nil {
			return err
		}
		if f.DeadLettered != int64(len(run.dead)) {
			return fmt.Errorf("%d dead letters, want %d", f.DeadLettered, len(run.dead))
		}
		got, err := orders.Statuses(ctx, s, "orders")
		if err != nil {
			return err
		}
		if err := sameStatuses(got, run.final); err != nil {
			return err
		}
		if retries, err = countRows(ctx, s, "orders.retry"); err != nil {
			return err
		}
		events, err := eventsRead(ctx, s)
		if err != nil {
			return err
		}
		// Each record read, of either topic, is applied or dead-lettered.
		if read := f.Applied + f.DeadLettered; events != int64(len(run.events)) || read != events+retries {
			return fmt.Errorf("%d events of %d read, %d records applied or dead-lettered, %d retries sent",
				events, len(run.events), read, retries)
		}
		return relayDone(ctx, s)
	})
	return retries
}

func sameStatuses(got, want map[string]orders.Status) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d orders with a status, want %d", len(got), len(want))
	}
	for id, st := range want {
		if got[id] != st {
			return fmt.Errorf("order %s is %q, want %q", id, got[id], st)
		}
	}
	return nil
}

// countRows counts the outbox rows of topic.
func countRows(ctx context.Context, s *outbox.Store, topic string) (int64, error) {
	var n int64
	err := outboxtest.Get(ctx, s, &n, `SELECT count(*) FROM outbox WHERE topic = ?`, topic)
	return n, err
}

// eventsRead is how many records of orders.events the stored positions
// cover (its partitions start at 0 and hold no transaction markers).
func eventsRead(ctx context.Context, s *outbox.Store) (int64, error) {
	cps, err := s.ReadPositions(ctx, "orders")
	if err != nil {
		return 0, err
	}
	var n int64
	for _, c := range cps {
		if c.Partition < kafkafeed.PartitionStride {
			n += c.Position
		}
	}
	return n, nil
}

// checkOrderTopics reads the output topics with read_committed and checks
// them exactly: every order's changes once each, in order; every bad record
// dead-lettered once with its reason; every retry once.
func checkOrderTopics(t *testing.T, broker string, run *ordersRun, retries int64) {
	t.Helper()
	got := readAll(t, broker, "orders.status", "orders.dlq", "orders.retry")
	changes := map[string][]orderChange{}
	for _, c := range got["orders.status"] {
		var sc orders.StatusChange
		if err := json.Unmarshal([]byte(c.Value), &sc); err != nil {
			t.Fatalf("status record %+v: %v", c, err)
		}
		if sc.OrderID != c.Key {
			t.Fatalf("status record %+v keyed %q", sc, c.Key)
		}
		changes[c.Key] = append(changes[c.Key], orderChange{Status: string(sc.Status), Previous: string(sc.Previous), At: sc.At})
	}
	if len(changes) != len(run.changes) {
		t.Errorf("changes of %d orders, want %d", len(changes), len(run.changes))
	}
	for id, want := range run.changes {
		if fmt.Sprint(changes[id]) != fmt.Sprint(want) {
			t.Fatalf("order %s: changes %v, want %v", id, changes[id], want)
		}
	}
	seen := map[string]bool{}
	for _, c := range got["orders.dlq"] {
		reason, ok := run.dead[c.Value]
		switch {
		case !ok:
			t.Fatalf("dead letter %q: not a bad record", c.Value)
		case seen[c.Value]:
			t.Fatalf("dead letter %q: twice", c.Value)
		case c.Headers[ingest.HeaderReason] != reason:
			t.Fatalf("dead letter %q: reason %q, want %q", c.Value, c.Headers[ingest.HeaderReason], reason)
		}
		seen[c.Value] = true
	}
	if len(seen) != len(run.dead) {
		t.Fatalf("%d dead letters on orders.dlq, want %d", len(seen), len(run.dead))
	}
	if n := int64(len(got["orders.retry"])); n != retries {
		t.Fatalf("%d records on orders.retry, want the %d sent", n, retries)
	}
	t.Logf("%d changes of %d orders, %d dead letters, %d retries", len(got["orders.status"]), len(changes), len(seen), retries)
}

// checkOrderCounters checks the feed's stored counters.
func checkOrderCounters(t *testing.T, db string, run *ordersRun, retries int64) {
	t.Helper()
	f, err := readStore(t, db).Feed(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if f.Applied+f.DeadLettered != int64(len(run.events))+retries || f.DeadLettered != int64(len(run.dead)) ||
		f.ReplaysSkipped != 0 || f.CompletionFailures != 0 || !f.Lossless || f.Kind != ingest.KindKafka {
		t.Fatalf("feed %+v: want applied+deadLettered %d, deadLettered %d, no replays, lossless",
			f, int64(len(run.events))+retries, len(run.dead))
	}
}

// checkOrderStatusAPI checks GET /feeds/orders/status against the store:
// the same counters, and no lag on any partition (the retry topic's commit
// markers included) once everything is applied.
func checkOrderStatusAPI(t *testing.T, p *proc, db string) {
	t.Helper()
	m := regexp.MustCompile(`HTTP API listening.* addr=(\S+)`).FindStringSubmatch(p.log.String())
	if m == nil {
		t.Fatal("the server's log names no HTTP address")
	}
	f, err := readStore(t, db).Feed(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	wait(t, 15*time.Second, func() error {
		resp, err := http.Get("http://" + m[1] + "/feeds/orders/status")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var st api.FeedStatus
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return fmt.Errorf("status %s: %w", resp.Status, err)
		}
		if st.Applied != f.Applied || st.DeadLettered != f.DeadLettered || st.ReplaysSkipped != f.ReplaysSkipped ||
			st.CompletionFailures != f.CompletionFailures || st.Lossless != f.Lossless || st.Kind != ingest.KindKafka {
			return fmt.Errorf("status %+v, want the store's counters %+v", st, f)
		}
		if st.Lag != 0 {
			return fmt.Errorf("lag %d, want 0: partitions %+v", st.Lag, st.Partitions)
		}
		return nil
	})
}

func TestOrders_RetentionGap(t *testing.T) {
	broker := startBroker(t)
	adm := createTopic(t, broker, "gap.events", 1)
	db := filepath.Join(t.TempDir(), "outboxd.db")
	args := []string{"--db", db, "--feed", "gap=kafka:gap.events", "--processor", "gap=orders",
		"--brokers", broker, "--relay", "none", "--http", "127.0.0.1:0"}
	placed := func(from, to int) []orderEvent {
		var es []orderEvent
		for i := from; i < to; i++ {
			es = append(es, orderEvent{key: fmt.Sprintf("g-%d", i), value: `{"type":"placed","at":"2026-01-01T00:00:00Z"}`})
		}
		return es
	}
	produceOrdersTo(t, broker, "gap.events", placed(0, 10))
	p := start(t, nil, args...)
	waitRunning(t, p)
	waitPosition(t, db, "gap", 10)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}

	// While the server is down, 10 more arrive and retention deletes the
	// first 15 offsets: 5 were never read.
	produceOrdersTo(t, broker, "gap.events", placed(10, 20))
	var offs kadm.Offsets
	offs.AddOffset("gap.events", 0, 15, -1)
	resps, err := adm.DeleteRecords(context.Background(), offs)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	p = start(t, nil, args...)
	waitRunning(t, p)
	waitPosition(t, db, "gap", 20)
	p.stop(t, 30*time.Second)

	s := readStore(t, db)
	losses, err := s.Losses(context.Background(), "gap")
	if err != nil {
		t.Fatal(err)
	}
	if len(losses) != 1 || losses[0].From != 10 || losses[0].To != 15 || losses[0].Reason != kafkafeed.LossRetention {
		t.Fatalf("losses %+v, want one retention loss 10..15", losses)
	}
	f, err := s.Feed(context.Background(), "gap")
	if err != nil {
		t.Fatal(err)
	}
	if f.Lossless || f.Applied != 15 {
		t.Fatalf("feed %+v: want lossless false, 15 applied", f)
	}
	st, err := orders.Statuses(context.Background(), s, "gap")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if lost := i >= 10 && i < 15; (st[fmt.Sprintf("g-%d", i)] == "") != lost {
			t.Errorf("order g-%d: status %q, lost %v", i, st[fmt.Sprintf("g-%d", i)], lost)
		}
	}
}

// produceOrdersTo produces events to topic at once.
func produceOrdersTo(t *testing.T, broker, topic string, events []orderEvent) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(events))
	for i, e := range events {
		recs[i] = &kgo.Record{Key: []byte(e.key), Value: []byte(e.value)}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// waitRunning waits until the server has opened (and migrated) its
// database, so the test's own opening of it never races the migration.
func waitRunning(t *testing.T, p *proc) {
	t.Helper()
	wait(t, 30*time.Second, func() error {
		if !strings.Contains(p.log.String(), "outboxd running") {
			return errors.New("the server is not running yet")
		}
		return nil
	})
}

// waitPosition waits until the feed's partition 0 stands at pos.
func waitPosition(t *testing.T, db, feed string, pos int64) {
	t.Helper()
	wait(t, 30*time.Second, func() error {
		if got := storedPosition(t, db, feed); got != pos {
			return fmt.Errorf("stored position %d, want %d", got, pos)
		}
		return nil
	})
}
