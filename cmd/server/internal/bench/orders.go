package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/internal/kafka"
)

// orderSteps are the events every generated order goes through, in order.
var orderSteps = []string{"placed", "paid", "shipped", "delivered"}

// orderGen yields order events over a fixed number of open orders (the
// state's size): each event takes the next step of a pseudo-random one of
// them, and an order that is delivered is replaced by a new one. Times grow
// with the event's index, so every order's events come in order and none is
// refused.
type orderGen struct {
	orders int
	i      int64
	step   []uint8  // each slot's next step
	gen    []uint32 // each slot's order generation
	base   time.Time
	buf    []byte
}

func newOrderGen(orders int) *orderGen {
	return &orderGen{orders: orders, step: make([]uint8, orders), gen: make([]uint32, orders),
		base: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// next returns the next event's key (the order id) and value; both are
// valid until the following call. finished is set when it delivers its
// order.
func (g *orderGen) next() (key, value []byte, finished bool) {
	s := int(mix64(uint64(g.i)) % uint64(g.orders))
	typ := orderSteps[g.step[s]]
	g.buf = append(g.buf[:0], "o-"...)
	g.buf = strconv.AppendInt(g.buf, int64(s), 10)
	g.buf = append(g.buf, '-')
	g.buf = strconv.AppendUint(g.buf, uint64(g.gen[s]), 10)
	k := len(g.buf)
	g.buf = append(g.buf, `{"type":"`...)
	g.buf = append(g.buf, typ...)
	g.buf = append(g.buf, `","at":"`...)
	g.buf = g.base.Add(time.Duration(g.i)*time.Millisecond).AppendFormat(g.buf, time.RFC3339Nano)
	g.buf = append(g.buf, `"}`...)
	if g.step[s]++; int(g.step[s]) == len(orderSteps) {
		g.step[s], finished = 0, true
		g.gen[s]++
	}
	g.i++
	return g.buf[:k], g.buf[k:], finished
}

// orderChunk is how many order events one Produce call sends: the
// events are held in memory a chunk at a time.
const orderChunk = 1 << 16

// orderData describes the events put on a topic.
type orderData struct {
	Topic    string
	Events   int64
	Orders   int   // open orders at any time
	Finished int64 // orders delivered
}

// produceOrders puts n events over orders open orders on topic, keyed by
// order id (so one order's events share a partition and keep their order),
// before any phase reads them.
func (b *bench) produceOrders(ctx context.Context, topic string, n int64, orders int) (orderData, error) {
	d := orderData{Topic: topic, Events: n, Orders: orders}
	cl, err := b.kafkaClient()
	if err != nil {
		return d, err
	}
	defer cl.Close()
	g := newOrderGen(orders)
	msgs := make([]kafka.Message, 0, min(n, orderChunk))
	for i := range n {
		key, value, finished := g.next()
		if finished {
			d.Finished++
		}
		msgs = append(msgs, kafka.Message{Topic: topic, Partition: kafka.ByKey,
			Key: append([]byte(nil), key...), Value: append([]byte(nil), value...)})
		if len(msgs) == cap(msgs) || i == n-1 {
			if err := cl.Produce(ctx, msgs); err != nil {
				return d, fmt.Errorf("produce order events: %w", err)
			}
			msgs = msgs[:0]
		}
	}
	return d, nil
}

// runOrders measures the orders processor: the events on a topic read by
// the server's Kafka feed, relay off, from its start until the feed's
// positions cover every event. There is no ceiling: the processor's
// reads (the event's place, its order's history) are its own.
func (b *bench) runOrders(ctx context.Context) error {
	res, _, err := b.ordersAt(ctx, "ingest", b.o.Accounts)
	if err != nil {
		return err
	}
	b.res.Ingest = res
	return nil
}

// ordersAt produces --lines events over orders open orders and runs the
// server over them into a fresh database.
func (b *bench) ordersAt(ctx context.Context, name string, orders int) (_ *phaseResult, dbMiB float64, err error) {
	topic := b.topic("orders-" + strconv.Itoa(orders))
	if err := b.createTopics(ctx, topic); err != nil {
		return nil, 0, err
	}
	defer b.doneWithTopic(topic)
	d, err := b.produceOrders(ctx, topic, b.o.Lines, orders)
	if err != nil {
		return nil, 0, err
	}
	db := b.engineDB(name + "-orders.db")
	defer removeDB(db)
	// The phase names the server child's profile (--cpuprofile), in a
	// sweep as in a single run.
	prev := b.phase
	b.phase = name
	defer func() { b.phase = prev }()
	res, last, err := b.timeEngine(ctx, name, engineSpec{db: db, source: "kafka:" + topic, topic: b.topic("status"), relay: "none"},
		d.Events, fmt.Sprintf("the feed to apply %d events", d.Events), func(e *engineRun) (bool, error) {
			n, err := e.w.applied(ctx)
			return n >= d.Events, err
		})
	if err != nil {
		return nil, 0, err
	}
	// Every event changes its order's status once, and none is refused.
	if last != d.Events {
		b.res.Verify.fail("%s: %d status changes for %d events", name, last, d.Events)
	}
	// The state the events built, as the sweep's "db MiB" (a ledger
	// point's is the database prefilled before it).
	if fi, err := os.Stat(db); err == nil {
		dbMiB = round1(float64(fi.Size()) / (1 << 20))
	}
	return res, dbMiB, nil
}
