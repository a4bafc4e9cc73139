package orders

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// side is one implementation under the differential test: a store of its
// own and the processor's Apply (and Prepare, when it has one).
type side struct {
	name    string
	store   *outbox.Store
	apply   func(context.Context, *outbox.Tx, ingest.Delivery, ingest.Item) error
	prepare func(context.Context, *outbox.Tx, string, []ingest.Item) error
	after   int64
}

var (
	testFeeds = []string{"orders", "orders2"}
	testNow   = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	// Order ids, some of them with every byte SQLite's JSON quotes.
	testOrders = []string{"o-1", "o-2", "o-3", "o-4", "o-5", "o-6", "o-7", "o-8",
		"q\"uote", "back\\slash", "nul\x00byte", "tab\tnl\n\x1f\x7f", "é<&>\u2028", "bad\xff\xfeutf8"}
)

// On PostgreSQL the ids that are not UTF-8 without NUL are left out:
// such a key is dead-lettered there (TestProcessor_PostgresKeyNotText),
// and so are the epoch's bytes that are not UTF-8.
func init() {
	if outboxtest.OnPostgres() {
		testOrders = slices.DeleteFunc(slices.Clone(testOrders), func(id string) bool { return !pgKey([]byte(id)) })
		testEpoch = strings.ToValidUTF8(testEpoch, "") // a feed's epochs are outboxd's, UTF-8
	}
}

const testRetryPart = 1 << 16

// testEpoch starts the main topic's epochs, with bytes the compacted
// histories' JSON must quote.
var testEpoch = "t\"q\\b\t\n\x01\x1fé\xff:"

func newSide(t *testing.T, name string, proc *Processor, ref bool) *side {
	t.Helper()
	ctx := context.Background()
	// The reference is the model, and its SQL is SQLite's: it runs on
	// SQLite whatever the engine under test.
	s := outboxtest.NewStore(t, nil)
	if ref {
		s = outboxtest.OpenStore(t, outbox.DefaultConfig(filepath.Join(t.TempDir(), name+".db")))
	}
	for _, f := range testFeeds {
		if err := s.RegisterFeed(ctx, outbox.FeedInfo{Name: f}); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Setup(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	sd := &side{name: name, store: s, apply: proc.Apply, prepare: proc.Prepare}
	if ref {
		sd.apply, sd.prepare = reference{proc}.Apply, nil
	}
	return sd
}

func newTestProcessor(t *testing.T) *Processor {
	t.Helper()
	cfg := DefaultConfig("orders", "orders.events")
	cfg.Now = func() time.Time { return testNow }
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// step is one record of a transaction and what becomes of it.
type step struct {
	d          ingest.Delivery
	item       ingest.Item
	rollback   bool // undo the item after Apply succeeded (a later failure)
	inPrepared bool // shown to Prepare
}

// gen makes the records: the events of a few orders at a time, each
// order's in the order of its times but now and then one ahead of its
// turn (refused, then coming back through the retry topic), sent twice
// (a duplicate) or late, after its order was compacted; events of random
// type and time, bad records, records read again at their place, and the
// retry records the processors sent, some with another key.
type gen struct {
	rng     *rand.Rand
	next    map[int32]int64 // per feed partition, the next offset
	read    []step          // main-topic records given so far
	retries []outbox.Row    // retry records sent
	orders  [][]string      // per order slot, its events still to send
	gens    []int           // per order slot, how many orders it had
	late    []string        // events already sent, to send again later
	minute  int
}

// script returns the events of a new order of slot i, at growing times.
func (g *gen) script(i int) []string {
	g.gens[i]++
	id := testOrders[i] + "#" + strconv.Itoa(g.gens[i])
	types := []string{"placed", "paid", "shipped", "delivered"}
	switch g.rng.IntN(4) {
	case 0:
		types = []string{"placed", "cancelled"}
	case 1:
		types = []string{"placed", "paid", "cancelled"}
	}
	var evs []string
	for _, typ := range types {
		g.minute += 1 + g.rng.IntN(2)
		evs = append(evs, id+"\x01"+fmt.Sprintf(`{"type":%q,"at":"2026-05-01T%02d:%02d:00Z"}`, typ, g.minute/60%24, g.minute%60))
	}
	return evs
}

// event returns the key and value of the next event to send.
func (g *gen) event() (string, string) {
	r := g.rng
	if g.orders == nil {
		g.orders, g.gens = make([][]string, len(testOrders)), make([]int, len(testOrders))
	}
	var ev string
	switch x := r.IntN(100); {
	case x < 8 && len(g.late) > 0:
		ev = g.late[r.IntN(len(g.late))]
	case x < 16: // of random type and time
		types := []string{"placed", "paid", "shipped", "delivered", "cancelled"}
		i := r.IntN(len(testOrders))
		id := testOrders[i] + "#" + strconv.Itoa(max(g.gens[i], 1))
		m := max(g.minute-r.IntN(10), 0)
		ev = id + "\x01" + fmt.Sprintf(`{"type":%q,"at":"2026-05-01T%02d:%02d:00Z"}`, types[r.IntN(len(types))], m/60%24, m%60)
	default:
		i := r.IntN(len(testOrders))
		if len(g.orders[i]) == 0 {
			g.orders[i] = g.script(i)
		}
		evs := g.orders[i]
		k := 0
		if len(evs) > 1 && r.IntN(8) == 0 {
			k = 1 // ahead of its turn
		}
		ev = evs[k]
		g.orders[i] = slices.Delete(slices.Clone(evs), k, k+1)
		if r.IntN(6) == 0 {
			g.late = append(g.late, ev)
		}
	}
	key, value, _ := strings.Cut(ev, "\x01")
	return key, value
}

func (g *gen) record(feed string) step {
	r := g.rng
	switch x := r.IntN(100); {
	case x < 5 && len(g.read) > 0: // read again at its place, lately read mostly
		s := g.read[max(0, len(g.read)-1-r.IntN(min(len(g.read), 60)))]
		s.d.Feed = feed
		return step{d: s.d, item: s.item}
	case x < 9 && len(g.read) > 0:
		// A retry record naming the place of one lately read, with
		// another event: only the place says it was applied.
		from := g.read[max(0, len(g.read)-1-r.IntN(min(len(g.read), 60)))]
		k, v := g.event()
		if r.IntN(2) == 0 {
			k = string(from.item.Key)
		}
		item := ingest.Item{Key: []byte(k), Value: []byte(v)}
		o := ingest.Origin{Topic: "orders.events", Partition: from.d.Partition, Epoch: from.d.Epoch, Offset: from.d.Position - 1}
		out := ingest.RetryOutput("orders.retry", item, o, 2, testNow)
		off := g.next[testRetryPart]
		g.next[testRetryPart]++
		d := ingest.Delivery{Feed: feed, Partition: testRetryPart, Topic: "orders.retry", Epoch: "retry:0", Position: off + 1, Attempt: 1}
		return step{d: d, item: ingest.Item{Key: item.Key, Value: item.Value, Headers: out.Headers}}
	case x < 20 && len(g.retries) > 0:
		row := g.retries[r.IntN(len(g.retries))]
		hs, err := outbox.DecodeHeaders(row.Headers)
		if err != nil {
			panic(err)
		}
		key, value := row.Key, row.Value
		switch x { // a retry record not of the processor's making
		case 5:
			key = []byte(testOrders[r.IntN(len(testOrders))] + "#1")
		case 6, 7:
			_, v := g.event()
			value = []byte(v)
		}
		off := g.next[testRetryPart]
		g.next[testRetryPart]++
		d := ingest.Delivery{Feed: feed, Partition: testRetryPart, Topic: "orders.retry", Epoch: "retry:0", Position: off + 1, Attempt: 1}
		return step{d: d, item: ingest.Item{Key: key, Value: value, Headers: hs}}
	}
	part := int32(r.IntN(3))
	off := g.next[part]
	g.next[part]++
	d := ingest.Delivery{Feed: feed, Partition: part, Topic: "orders.events", Epoch: testEpoch + strconv.Itoa(int(part)), Position: off + 1, Attempt: 1}
	k, value := g.event()
	key := []byte(k)
	switch x := r.IntN(100); {
	case x < 2:
		key = nil
	case x < 4:
		value = `{"type":"refunded","at":"2026-05-01T09:00:00Z"}`
	case x < 6:
		value = `{"type":`
	}
	s := step{d: d, item: ingest.Item{Key: key, Value: []byte(value)}}
	g.read = append(g.read, s)
	return s
}

// outcome is what one item's Apply gave.
type outcome struct {
	ok     bool
	reason string // of a permanent error
}

// run applies steps in one transaction of sd, committed unless abandon,
// and returns each item's outcome and the rows the commit wrote.
func (sd *side) run(t *testing.T, feed string, steps []step, abandon bool) ([]outcome, []outbox.Row) {
	t.Helper()
	ctx := context.Background()
	tx, err := sd.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if sd.prepare != nil {
		var items []ingest.Item
		for _, s := range steps {
			if s.inPrepared {
				items = append(items, s.item)
			}
		}
		if len(items) > 0 {
			if err := sd.prepare(ctx, tx, feed, items); err != nil {
				t.Fatal(err)
			}
		}
	}
	outs := make([]outcome, len(steps))
	for i, s := range steps {
		if err := tx.BeginItem(s.d.Place()); err != nil {
			t.Fatal(err)
		}
		err := sd.apply(ctx, tx, s.d, s.item)
		switch {
		case err != nil:
			p, ok := ingest.IsPermanent(err)
			if !ok {
				t.Fatalf("%s: item %d: transient error %v", sd.name, i, err)
			}
			outs[i] = outcome{reason: p.Reason}
			if err := tx.RollbackItem(); err != nil {
				t.Fatal(err)
			}
		case s.rollback:
			if err := tx.RollbackItem(); err != nil {
				t.Fatal(err)
			}
		default:
			outs[i] = outcome{ok: true}
			if err := tx.EndItem(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if abandon {
		return outs, nil
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("%s: commit: %v", sd.name, err)
	}
	rows, err := sd.store.Rows(ctx, sd.after, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) > 0 {
		sd.after = rows[len(rows)-1].ID
	}
	return outs, rows
}

// tables returns every row of the processor's tables (and of the index by
// place), in key order, each column as its type and bytes.
func (sd *side) tables(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []struct{ table, cols, order string }{
		{"orders_events", "feed, order_id, epoch, src_offset, topic, partition, type, at", "feed, order_id, epoch, src_offset"},
		{"orders_events INDEXED BY orders_events_place", "feed, epoch, src_offset, order_id", "feed, epoch, src_offset"},
		{"orders_done", "feed, order_id, history", "feed, order_id"},
		{"orders_status", "feed, order_id, status, at, events", "feed, order_id"},
	} {
		var exprs []string
		for _, c := range strings.Split(q.cols, ", ") {
			exprs = append(exprs, "typeof("+c+") || ':' || hex("+c+")")
		}
		table, order := q.table, q.order
		if sd.store.Postgres() {
			table, exprs, order = pgTables(q.table, q.cols, q.order)
		}
		var rows []string
		query := "SELECT " + strings.Join(exprs, " || ' ' || ") + " FROM " + table + " ORDER BY " + order
		if err := outboxtest.Select(context.Background(), sd.store, &rows, query); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %d rows\n%s\n", q.table, len(rows), strings.Join(rows, "\n"))
	}
	return b.String()
}

// pgTables is tables' query on PostgreSQL, made to read as SQLite's:
// each value as its SQLite type and the hex of its text, in SQLite's
// order of text (bytes, COLLATE "C"), the index named by no hint.
func pgTables(table, cols, order string) (string, []string, string) {
	integer := map[string]bool{"src_offset": true, "partition": true, "events": true}
	var exprs []string
	for _, c := range strings.Split(cols, ", ") {
		typ := "text"
		if integer[c] {
			typ = "integer"
		}
		exprs = append(exprs, "'"+typ+":' || upper(encode(convert_to("+c+"::text, 'UTF8'), 'hex'))")
	}
	var by []string
	for _, c := range strings.Split(order, ", ") {
		if !integer[c] {
			c += ` COLLATE "C"`
		}
		by = append(by, c)
	}
	table, _, _ = strings.Cut(table, " INDEXED BY")
	return table, exprs, strings.Join(by, ", ")
}

// TestProcessor_SameAsReference applies the same records to the processor,
// in batches with Prepare's hints, item rollbacks and abandoned
// transactions, and to the reference, which runs every item's statements
// in its savepoint: every item's outcome, every output and every row of
// the processor's tables must be the same.
func TestProcessor_SameAsReference(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { sameAsReference(t, seed) })
	}
}

func sameAsReference(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 13))
	got := newSide(t, "batched", newTestProcessor(t), false)
	want := newSide(t, "reference", newTestProcessor(t), true)
	g := &gen{rng: rng, next: map[int32]int64{}}
	var applied, nothing, refused, finishedOrders int
	for tx := 0; tx < 200; tx++ {
		feed := testFeeds[0]
		if rng.IntN(5) == 0 {
			feed = testFeeds[1]
		}
		steps := make([]step, 1+rng.IntN(40))
		hint := rng.IntN(3) // 0: no Prepare; 1: every item; 2: some
		for i := range steps {
			steps[i] = g.record(feed)
			steps[i].rollback = rng.IntN(10) == 0
			steps[i].inPrepared = hint == 1 || (hint == 2 && rng.IntN(2) == 0)
		}
		abandon := rng.IntN(20) == 0
		gotOuts, gotRows := got.run(t, feed, steps, abandon)
		wantOuts, wantRows := want.run(t, feed, steps, abandon)
		if !slices.Equal(gotOuts, wantOuts) {
			t.Fatalf("transaction %d: outcomes %v, want %v", tx, gotOuts, wantOuts)
		}
		if err := sameRows(gotRows, wantRows); err != nil {
			t.Fatalf("transaction %d: %v", tx, err)
		}
		for i, r := range wantRows {
			switch r.Topic {
			case "orders.retry":
				g.retries = append(g.retries, r)
				refused++
			case "orders.status":
				if i == 0 || wantRows[i-1].Position != r.Position || wantRows[i-1].Partition != r.Partition {
					applied++
				}
				if bytes.Contains(r.Value, []byte(`"status":"delivered"`)) || bytes.Contains(r.Value, []byte(`"status":"cancelled"`)) {
					finishedOrders++
				}
			}
		}
		if !abandon {
			for _, o := range wantOuts {
				if o.ok {
					nothing++
				}
			}
		}
		if tx%25 == 24 {
			if g, w := got.tables(t), want.tables(t); g != w {
				t.Fatalf("after transaction %d: tables\n%s\nwant\n%s", tx, g, w)
			}
		}
	}
	if g, w := got.tables(t), want.tables(t); g != w {
		t.Fatalf("tables\n%s\nwant\n%s", g, w)
	}
	nothing -= applied + refused
	t.Logf("%d events applied, %d refused, %d finishing, %d changing nothing", applied, refused, finishedOrders, nothing)
	if applied < 300 || refused < 300 || finishedOrders < 50 || nothing < 100 {
		t.Fatalf("the records exercised too little: %d applied, %d refused, %d finishing, %d changing nothing",
			applied, refused, finishedOrders, nothing)
	}
}

// sameRows compares outbox rows but for their ids and commit times.
func sameRows(got, want []outbox.Row) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d rows, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		g.ID, g.CreatedAt, w.ID, w.CreatedAt = 0, 0, 0, 0
		if !reflect.DeepEqual(g, w) {
			return fmt.Errorf("row %d: %+v, want %+v", i, g, w)
		}
	}
	return nil
}
