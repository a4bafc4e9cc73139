package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// example is the path of a configuration of examples/.
func example(name string) string { return filepath.Join("..", "examples", name) }

// allRows reads every outbox row, in id order.
func allRows(t *testing.T, s *outbox.Store) []outbox.Row {
	t.Helper()
	var out []outbox.Row
	var after int64
	for {
		rows, err := s.Rows(context.Background(), after, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			return out
		}
		out = append(out, rows...)
		after = rows[len(rows)-1].ID
	}
}

// keyValues lists the rows of topic as "key value", in id order.
func keyValues(rows []outbox.Row, topic string) []string {
	var out []string
	for _, r := range rows {
		if r.Topic == topic {
			out = append(out, string(r.Key)+" "+string(r.Value))
		}
	}
	return out
}

// deadReasons lists a feed's dead letters as "position reason".
func deadReasons(t *testing.T, s *outbox.Store, feed string) []string {
	t.Helper()
	dls, err := s.DeadLetters(context.Background(), feed, 0, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dls {
		out = append(out, fmt.Sprintf("%d %s", d.Position, d.Reason))
	}
	return out
}

// runFileExample runs the binary on an example's configuration with its
// feed reading input (data), relay off, until the feed has read it all,
// stops it with SIGTERM and returns its database, read side.
func runFileExample(t *testing.T, config, feed, data string, args ...string) *outbox.Store {
	t.Helper()
	dir := t.TempDir()
	input, db := filepath.Join(dir, "input"), filepath.Join(dir, "outboxd.db")
	writeFile(t, input, data)
	p := start(t, nil, append([]string{"--config", example(config), "--db", db, "--feed", feed + "=file:" + input,
		"--relay", "none", "--http", "127.0.0.1:0"}, args...)...)
	waitRunning(t, p)
	waitPosition(t, db, feed, int64(len(data)))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	return readStore(t, db)
}

// TestExamples_Dedup: examples/dedup.yaml publishes the first document of
// each id, exactly as read, once, and dead-letters the documents without
// an id; run with the real relay to a Kafka broker, a read_committed
// consumer of payments.unique sees exactly those.
func TestExamples_Dedup(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	bad := []string{`not json`, `{"amount":1}`, `{"id":7,"amount":1}`, `{"id":"","amount":1}`, `{"id":null}`, `[1,2]`}
	var b strings.Builder
	var want, wantDead []string
	seen := map[string]bool{}
	for i := range 2000 {
		line := fmt.Sprintf(`{"id":"p-%d","amount":%d,"n":%d}`, rng.IntN(300), rng.IntN(1000), i)
		if rng.IntN(40) == 0 {
			line = bad[rng.IntN(len(bad))]
		}
		b.WriteString(line + "\n")
		var doc struct{ ID any }
		if json.Unmarshal([]byte(line), &doc) != nil {
			wantDead = append(wantDead, fmt.Sprintf("%d malformed", b.Len()))
			continue
		}
		id, ok := doc.ID.(string)
		switch {
		case !ok || id == "":
			wantDead = append(wantDead, fmt.Sprintf("%d malformed", b.Len()))
		case !seen[id]:
			seen[id] = true
			want = append(want, id+" "+line)
		}
	}
	data := b.String()

	broker := startBroker(t)
	dir := t.TempDir()
	input, db := filepath.Join(dir, "payments.jsonl"), filepath.Join(dir, "outboxd.db")
	writeFile(t, input, data)
	p := start(t, nil, "--config", example("dedup.yaml"), "--db", db, "--feed", "payments=file:"+input,
		"--brokers", broker, "--http", "127.0.0.1:0")
	waitRunning(t, p)
	waitPosition(t, db, "payments", int64(len(data)))
	s := readStore(t, db)
	wait(t, 60*time.Second, func() error { return relayDone(context.Background(), s) })
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if got := keyValues(allRows(t, s), "payments.unique"); !reflect.DeepEqual(got, want) {
		t.Fatalf("outbox: %d outputs, want %d (one per id, its first document)", len(got), len(want))
	}
	if got := deadReasons(t, s, "payments"); !reflect.DeepEqual(got, wantDead) {
		t.Fatalf("dead letters %q\nwant %q", got, wantDead)
	}
	published := map[string]string{}
	for _, c := range readAll(t, broker, "payments.unique")["payments.unique"] {
		if prev, twice := published[c.Key]; twice {
			t.Fatalf("id %s published twice: %s, then %s", c.Key, prev, c.Value)
		}
		published[c.Key] = c.Value
	}
	if len(published) != len(want) || len(seen) < 250 {
		t.Fatalf("%d ids published, want %d", len(published), len(want))
	}
	for _, kv := range want {
		id, doc, _ := strings.Cut(kv, " ")
		if published[id] != doc {
			t.Fatalf("id %s published as %q, want %q", id, published[id], doc)
		}
	}
}

// TestExamples_Windows: examples/windows.yaml publishes each closed
// window's count per page once, for clicks out of order, and dead-letters
// the late clicks and those without a page or a time.
func TestExamples_Windows(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	cf := makeClicks(rng, 1500, 20)
	s := runFileExample(t, "windows.yaml", "clicks", cf.data)
	if got := keyValues(allRows(t, s), "clicks.per-minute"); !reflect.DeepEqual(got, cf.outputs) {
		for i := range min(len(got), len(cf.outputs)) {
			if got[i] != cf.outputs[i] {
				t.Fatalf("output %d of %d/%d: %s, want %s", i, len(got), len(cf.outputs), got[i], cf.outputs[i])
			}
		}
		t.Fatalf("%d outputs, want %d", len(got), len(cf.outputs))
	}
	if got := deadReasons(t, s, "clicks"); !reflect.DeepEqual(got, cf.dead) {
		t.Fatalf("dead letters %q\nwant %q", got, cf.dead)
	}
	if len(cf.outputs) < 60 || len(cf.dead) < 40 {
		t.Fatalf("%d outputs and %d dead letters: the input tests too little", len(cf.outputs), len(cf.dead))
	}
}

// orderEvents makes events for n orders, each order's in the order of its
// life (a prefix of placed, paid, shipped, delivered, or a cancel while
// placed or paid), at times that rise per order, some with a fraction of a
// second, some in another zone; with the same event again now and then (in
// the same or another zone), and events without a key, that are not JSON,
// without a type or a time, or of a type no order has.
func orderEvents(rng *rand.Rand, n int) (events []orderEvent, changes, dead int) {
	lives := [][]string{{"placed"}, {"placed", "paid"}, {"placed", "paid", "shipped"},
		{"placed", "paid", "shipped", "delivered"}, {"placed", "cancelled"}, {"placed", "paid", "cancelled"}}
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	type pending struct {
		id   string
		evs  []string // JSON values
		next int
	}
	var orders []*pending
	for i := range n {
		o := &pending{id: fmt.Sprintf("o-%d", i)}
		at := base.Add(time.Duration(rng.IntN(3600)) * time.Second)
		for _, typ := range lives[rng.IntN(len(lives))] {
			at = at.Add(time.Duration(1+rng.IntN(5000)) * time.Millisecond)
			if rng.IntN(3) == 0 {
				at = at.Truncate(time.Second).Add(time.Second)
			}
			stamp := at.Format(time.RFC3339Nano)
			if rng.IntN(4) == 0 {
				stamp = at.In(time.FixedZone("", -5*3600)).Format(time.RFC3339Nano)
			}
			ev := fmt.Sprintf(`{"type":%q,"at":%q,"by":"test"}`, typ, stamp)
			o.evs = append(o.evs, ev)
			changes++
			if rng.IntN(6) == 0 { // the same event again, as it was or in UTC
				o.evs = append(o.evs, fmt.Sprintf(`{"type":%q,"at":%q}`, typ, at.UTC().Format(time.RFC3339Nano)))
			}
		}
		orders = append(orders, o)
	}
	bad := []orderEvent{{key: "", value: `{"type":"placed","at":"2026-12-01T10:00:00Z"}`},
		{key: "o-bad", value: "not json"}, {key: "o-bad", value: `{"at":"2026-12-01T10:00:00Z"}`},
		{key: "o-bad", value: `{"type":"placed"}`}, {key: "o-bad", value: `{"type":"refunded","at":"2026-12-01T10:00:00Z"}`},
		{key: "o-bad", value: `{"type":"","at":"2026-12-01T10:00:00Z"}`}}
	for len(orders) > 0 {
		if rng.IntN(25) == 0 {
			events = append(events, bad[rng.IntN(len(bad))])
			dead++
			continue
		}
		i := rng.IntN(len(orders))
		o := orders[i]
		events = append(events, orderEvent{key: o.id, value: o.evs[o.next]})
		if o.next++; o.next == len(o.evs) {
			orders = append(orders[:i], orders[i+1:]...)
		}
	}
	return events, changes, dead
}

// TestExamples_Orders runs the built-in Go orders processor and the SQL one
// of examples/orders.yaml in one server, two feeds on the same topic: for
// every event, both emit the same records (topic, key, value), and both
// dead-letter the same events for the same reasons.
func TestExamples_Orders(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	events, changes, dead := orderEvents(rand.New(rand.NewPCG(seed, 13)), 400)
	broker := startBroker(t)
	createTopic(t, broker, "orders.events", 3)
	produceOrdersTo(t, broker, "orders.events", events)
	db := filepath.Join(t.TempDir(), "outboxd.db")
	p := start(t, nil, "--config", example("orders.yaml"), "--db", db, "--brokers", broker, "--relay", "none",
		"--feed", "goorders=kafka:orders.events", "--processor", "goorders=orders", "--topic", "goorders=orders.status",
		"--http", "127.0.0.1:0")
	waitRunning(t, p)
	s := readStore(t, db)
	wait(t, 60*time.Second, func() error {
		for _, feed := range []string{"orders", "goorders"} {
			f, err := s.Feed(context.Background(), feed)
			if err != nil {
				return err
			}
			if got := f.Applied + f.DeadLettered; got != int64(len(events)) {
				return fmt.Errorf("feed %s handled %d events of %d", feed, got, len(events))
			}
		}
		return nil
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	byFeed := map[string][]string{}
	for _, r := range allRows(t, s) {
		if r.Topic == "orders.status" {
			byFeed[r.Feed] = append(byFeed[r.Feed], fmt.Sprintf("%s %d %d/%d %s %s %s", r.Epoch, r.Partition, r.Position, r.N, r.Topic, r.Key, r.Value))
		}
	}
	goOut, sqlOut := byFeed["goorders"], byFeed["orders"]
	slices.Sort(goOut) // each partition's in order; the partitions interleave as they came
	slices.Sort(sqlOut)
	if len(goOut) != changes {
		t.Fatalf("the Go processor made %d changes, want %d", len(goOut), changes)
	}
	if !reflect.DeepEqual(goOut, sqlOut) {
		for i := range min(len(goOut), len(sqlOut)) {
			if goOut[i] != sqlOut[i] {
				t.Fatalf("change %d of %d/%d differs:\n Go:  %s\n SQL: %s", i, len(goOut), len(sqlOut), goOut[i], sqlOut[i])
			}
		}
		t.Fatalf("Go made %d changes, SQL %d", len(goOut), len(sqlOut))
	}
	goDead, sqlDead := deadByPlace(t, s, "goorders"), deadByPlace(t, s, "orders")
	if len(goDead) != dead || !reflect.DeepEqual(goDead, sqlDead) {
		t.Fatalf("dead letters: Go %d %q, SQL %d %q, want %d", len(goDead), goDead, len(sqlDead), sqlDead, dead)
	}
	t.Logf("%d events: %d changes and %d dead letters, the same from both", len(events), changes, dead)
}

// deadByPlace lists a feed's dead letters as "epoch partition/position
// reason", sorted: two feeds on the same partitions interleave them in
// their own ways.
func deadByPlace(t *testing.T, s *outbox.Store, feed string) []string {
	t.Helper()
	dls, err := s.DeadLetters(context.Background(), feed, 0, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dls {
		out = append(out, fmt.Sprintf("%s %d/%d %s", d.Epoch, d.Partition, d.Position, d.Reason))
	}
	slices.Sort(out)
	return out
}

// TestExamples_MistakeAtStart starts the binary on examples/ledger.yaml
// with one statement broken in each way the start refuses: each exits 2
// with one line naming the feed, the processor and the statement, and
// creates nothing.
func TestExamples_MistakeAtStart(t *testing.T) {
	src, err := os.ReadFile(example("ledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	input, db := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "data", "outboxd.db")
	writeFile(t, input, "a,1\n")
	for _, tc := range []struct{ name, from, to, want string }{
		{"NoSuchColumn", "ON CONFLICT (account)", "ON CONFLICT (acount)",
			"feed ledger: processors.sql-ledger: apply (INSERT INTO balances (account, balance) VALUES ( ...): no such column: acount"},
		{"WritesOutboxdTables", "INSERT INTO balances (account, balance) VALUES (:account, :amount)\n        ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance;",
			"UPDATE positions SET position = 0;",
			"feed ledger: processors.sql-ledger: apply (UPDATE positions SET position = 0): writes outboxd's table positions " +
				"(user SQL may read outboxd's tables, never write them)"},
		{"EmitWithoutValue", "END AS value", "END AS val",
			`feed ledger: processors.sql-ledger: emit (SELECT :account AS key, CASE WHEN (:account || : ...): column "val" is not one of topic, key, value, headers (name columns with AS)`},
		{"UnknownParameter", ":amount) <> 'integer'", ":amt) <> 'integer'",
			"--config PATH: line 20: processors.sql-ledger: reject (SELECT 'malformed' WHERE typeof(:account) <> 'te ...): unknown parameter :amt (known: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(src), tc.from) {
				t.Fatalf("examples/ledger.yaml holds no %q", tc.from)
			}
			path := filepath.Join(dir, tc.name+".yaml")
			writeFile(t, path, strings.Replace(string(src), tc.from, tc.to, 1))
			p, _ := launch(t, nil, "", nil, "--config", path, "--db", db, "--feed", "ledger=file:"+input,
				"--relay", "none", "--http", "127.0.0.1:0")
			if code := waitExit(t, p, 30*time.Second); code != exitConfig {
				t.Fatalf("exit code %d, want %d", code, exitConfig)
			}
			want := "server: " + strings.Replace(tc.want, "PATH", path, 1) // found as the file is read: its line
			if line := oneLine(t, p); !strings.HasPrefix(line, want) {
				t.Fatalf("message\n%q\nwant it to start\n%q", line, want)
			}
			if _, err := os.Stat(filepath.Dir(db)); !os.IsNotExist(err) {
				t.Fatalf("a refused start created %s (%v)", filepath.Dir(db), err)
			}
		})
	}
}
