package bench

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/relay"
)

// produceWindow bounds what raw_produce builds, untimed, before sending
// it: records and their bytes. A larger window would make the ceiling pay
// for the collector scanning it (with 1 KiB lines, 256k prebuilt records
// made raw_produce slower than the relay itself).
const (
	produceWindow      = 64 << 10
	produceWindowBytes = 16 << 20
)

// rawProducer sends the records the relay would publish for the file with
// the relay's own exactly-once producer (relay.OpenProducer: its sarama
// configuration and its requests), in transactions of --relay-batch, with
// no SQLite and no progress record. The records are built before the
// timer.
type rawProducer struct {
	p         *relay.Producer
	topic     string
	processor string
	balances  []int64
	feed      []byte
	epoch     []byte
}

// newRawProducer starts the relay's producer, with transactional id txnID,
// sending to topic; the function it returns closes it.
func (b *bench) newRawProducer(ctx context.Context, topic, txnID string) (*rawProducer, func(), error) {
	cfg := relay.DefaultConfig()
	cfg.Brokers = b.brokers
	p, err := relay.OpenProducer(ctx, cfg, txnID)
	if err != nil {
		return nil, nil, err
	}
	return &rawProducer{p: p, topic: topic, processor: b.o.Processor, feed: []byte(benchFeed), epoch: []byte(floorEpoch)},
		p.Close, nil
}

// runRawProduce measures the relay ceiling.
func (b *bench) runRawProduce(ctx context.Context) error {
	p, done, err := b.fileProducer(ctx, "raw")
	if err != nil {
		return err
	}
	defer done()
	g := b.data.gen()
	m := b.startInProcess()
	var timed, proc, brok time.Duration
	for left := b.data.Lines; left > 0; {
		window := p.window(g, left, b.o.LineBytes)
		left -= int64(len(window))
		collected := withoutGC()
		t0, span := time.Now(), cpuSpan{brokerPID: b.brokerPID()}
		span.start()
		err := p.send(ctx, window, b.o.RelayBatch)
		timed += time.Since(t0)
		collected()
		if err != nil {
			return err
		}
		dp, db := span.since()
		proc, brok = proc+dp, brok+db
	}
	res := newPhaseResult(b.data.Lines, timed)
	m.finish(b, "raw_produce", res)
	res.CPU = newCPUResult(proc, brok, b.data.Lines) // the timed parts only
	b.res.RawProduce = res
	releaseMemory()
	return nil
}

// warmBroker sends the file's records once, untimed, to a topic of their
// own that is deleted after: the dev broker's heap then has the size the
// phases' records need, a cost the first phase to send them would
// otherwise pay alone (with 1 KiB lines that LZ4 cannot compress,
// raw_produce run twice in a row took 1.59 s of the broker's CPU the
// first time and 0.80 s the second, as much as the relay's phase). A
// cluster given with --brokers is not warmed.
func (b *bench) warmBroker(ctx context.Context) error {
	if b.broker == nil {
		return nil
	}
	p, done, err := b.fileProducer(ctx, "warm")
	if err != nil {
		return err
	}
	defer done()
	g := b.data.gen()
	for left := b.data.Lines; left > 0; {
		window := p.window(g, left, b.o.LineBytes)
		left -= int64(len(window))
		if err := p.send(ctx, window, b.o.RelayBatch); err != nil {
			return err
		}
	}
	return nil
}

// fileProducer creates the topic of phase and starts a raw producer of
// the file's records to it; the function it returns closes the producer
// and frees the topic.
func (b *bench) fileProducer(ctx context.Context, phase string) (*rawProducer, func(), error) {
	topic := b.topic(phase)
	if err := b.createTopics(ctx, topic); err != nil {
		return nil, nil, err
	}
	p, closeProducer, err := b.newRawProducer(ctx, topic, b.prefix+"-"+phase)
	if err != nil {
		b.doneWithTopic(topic)
		return nil, nil, err
	}
	if p.processor == "ledger" {
		p.balances = make([]int64, b.data.Accounts)
	}
	return p, func() {
		closeProducer()
		b.doneWithTopic(topic)
	}, nil
}

// send publishes msgs in transactions of at most relayBatch records.
func (p *rawProducer) send(ctx context.Context, msgs []*sarama.ProducerMessage, relayBatch int) error {
	for len(msgs) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(len(msgs), relayBatch)
		if err := p.txn(ctx, msgs[:k]); err != nil {
			return err
		}
		msgs = msgs[k:]
	}
	return nil
}

// window builds the records of the next lines of g, at most left and
// within raw_produce's window.
func (p *rawProducer) window(g *lineGen, left int64, lineBytes int) []*sarama.ProducerMessage {
	return p.messages(g, min(left, produceWindow, int64(produceWindowBytes/max(lineBytes, 64))))
}

// messages builds the next n lines' records, as the relay builds them
// from outbox rows.
func (p *rawProducer) messages(g *lineGen, n int64) []*sarama.ProducerMessage {
	msgs := make([]*sarama.ProducerMessage, 0, n)
	at := time.Now() // the rows of one commit share their creation time
	for range n {
		l, text := g.next()
		var key, value []byte
		if p.processor == "ledger" {
			p.balances[l.Account] += l.Amount
			account := accountName(l.Account)
			key = []byte(account)
			value, _ = json.Marshal(ledger.Output{Account: account, Amount: l.Amount, Balance: p.balances[l.Account],
				Feed: benchFeed, Epoch: floorEpoch, Position: l.Position}) // plain fields: cannot fail
		} else {
			value = append([]byte(nil), text[:len(text)-1]...)
		}
		m := p.record(l.Index+1, l.Position, at, key, value)
		msgs = append(msgs, m)
	}
	return msgs
}

// record is the relay's record of the outbox row id, the output (key,
// value) of the line at pos, created at at.
func (p *rawProducer) record(id, pos int64, at time.Time, key, value []byte) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: p.topic, Timestamp: at,
		Headers: []sarama.RecordHeader{
			{Key: []byte(relay.HeaderID), Value: strconv.AppendInt(nil, id, 10)},
			{Key: []byte(relay.HeaderFeed), Value: p.feed},
			{Key: []byte(relay.HeaderEpoch), Value: p.epoch},
			{Key: []byte(relay.HeaderPosition), Value: strconv.AppendInt(nil, pos, 10)},
		}, Value: sarama.ByteEncoder(value)}
	if key != nil {
		m.Key = sarama.ByteEncoder(key)
	}
	return m
}

// txn sends msgs in one transaction and commits it.
func (p *rawProducer) txn(ctx context.Context, msgs []*sarama.ProducerMessage) error {
	return p.p.Publish(ctx, msgs)
}
