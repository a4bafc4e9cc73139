package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
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
// the relay's own sarama configuration (relay.ProducerConfig), in
// transactions of --relay-batch: begin, send every record, wait for each
// outcome, commit, with no SQLite and no progress record. The records are
// built before the timer; while one transaction's records are in flight the
// next one's are ready, as the relay's feeder has its next batch ready.
type rawProducer struct {
	ap        sarama.AsyncProducer
	topic     string
	processor string
	balances  []int64
	feed      []byte
	epoch     []byte
	acked     bool // the relay's configuration returns each record's success
	failures  *rawFailures
}

// newRawProducer starts a producer of the relay's configuration, with
// transactional id txnID, sending to topic; the function it returns
// closes it once its failures and successes are drained.
func (b *bench) newRawProducer(topic, txnID string) (*rawProducer, func(), error) {
	sc := relay.ProducerConfig(relay.DefaultConfig(), txnID)
	ap, err := sarama.NewAsyncProducer(b.brokers, sc)
	if err != nil {
		return nil, nil, fmt.Errorf("start transactional producer: %w", err)
	}
	p := &rawProducer{ap: ap, topic: topic, processor: b.o.Processor, feed: []byte(benchFeed), epoch: []byte(floorEpoch),
		acked: sc.Producer.Return.Successes, failures: &rawFailures{ch: make(chan struct{})}}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		p.failures.drain(ap, p.acked)
	}()
	return p, func() {
		ap.AsyncClose()
		if p.acked {
			go func() {
				for range ap.Successes() {
				}
			}()
		}
		<-drained
	}, nil
}

// runRawProduce measures the relay ceiling.
func (b *bench) runRawProduce(ctx context.Context) error {
	topic := b.topic("raw")
	if err := b.createTopics(ctx, topic); err != nil {
		return err
	}
	defer b.doneWithTopic(topic)
	p, closeProducer, err := b.newRawProducer(topic, b.prefix+"-raw")
	if err != nil {
		return err
	}
	defer closeProducer()
	if p.processor == "ledger" {
		p.balances = make([]int64, b.data.Accounts)
	}
	g := b.data.gen()
	m := b.startInProcess()
	var timed, proc, brok time.Duration
	for left := b.data.Lines; left > 0; {
		window := p.messages(g, min(left, produceWindow, int64(produceWindowBytes/max(b.o.LineBytes, 64))))
		left -= int64(len(window))
		t0, span := time.Now(), cpuSpan{brokerPID: b.brokerPID()}
		span.start()
		for len(window) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := min(len(window), b.o.RelayBatch)
			if err := p.txn(window[:k]); err != nil {
				return err
			}
			window = window[k:]
		}
		timed += time.Since(t0)
		dp, db := span.since()
		proc, brok = proc+dp, brok+db
	}
	res := newPhaseResult(b.data.Lines, timed)
	m.finish(b, "raw_produce", res)
	res.CPU = newCPUResult(proc, brok, b.data.Lines) // the timed parts only
	b.res.RawProduce = res
	return nil
}

// messages builds the next n lines' records, as the relay builds them
// from outbox rows.
func (p *rawProducer) messages(g *lineGen, n int64) []*sarama.ProducerMessage {
	msgs := make([]*sarama.ProducerMessage, 0, n)
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
		m := p.record(l.Index+1, l.Position, key, value)
		msgs = append(msgs, m)
	}
	return msgs
}

// record is the relay's record of the outbox row id, the output (key,
// value) of the line at pos.
func (p *rawProducer) record(id, pos int64, key, value []byte) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: p.topic, Timestamp: time.Now(),
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

// txn sends msgs in one transaction and commits it, waiting for the
// records' outcomes as the relay's producer does: one by one when the
// relay's configuration returns successes, by the commit otherwise.
func (p *rawProducer) txn(msgs []*sarama.ProducerMessage) error {
	if err := p.ap.BeginTxn(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	var err error
	if p.acked {
		go p.input(msgs)
		err = p.outcomes(len(msgs))
	} else {
		p.input(msgs) // the commit follows them into sarama's input
	}
	if err == nil {
		if err = p.ap.CommitTxn(); err == nil {
			return nil
		}
		if rerr := p.failures.first(); rerr != nil {
			err = rerr
		}
		err = fmt.Errorf("commit transaction: %w", err)
	}
	if aerr := p.ap.AbortTxn(); aerr != nil {
		err = errors.Join(err, fmt.Errorf("abort transaction: %w", aerr))
	}
	return err
}

func (p *rawProducer) input(msgs []*sarama.ProducerMessage) {
	for _, m := range msgs {
		p.ap.Input() <- m
	}
}

// outcomes waits for n records' successes or failures.
func (p *rawProducer) outcomes(n int) error {
	failed := 0
	for range n {
		select {
		case <-p.ap.Successes():
		case <-p.failures.ch:
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("produce: %d of %d records failed, the first with: %w", failed, n, p.failures.first())
	}
	return nil
}

// rawFailures drains a producer's Errors for its whole life, so a failed
// record never blocks sarama while the commit waits for it.
type rawFailures struct {
	mu  sync.Mutex
	err error
	ch  chan struct{} // a send per failure, when successes are returned
}

func (f *rawFailures) drain(ap sarama.AsyncProducer, acked bool) {
	for pe := range ap.Errors() {
		f.mu.Lock()
		if f.err == nil {
			f.err = pe.Err
		}
		f.mu.Unlock()
		if acked {
			f.ch <- struct{}{}
		}
	}
}

func (f *rawFailures) first() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
