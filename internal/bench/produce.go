package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/relay"
)

// rawProducerConfig is the relay's producer configuration (relay/producer.go):
// idempotent, acks=all, one request in flight, murmur2 keys, transactional.
// It is repeated here because the ceiling must not go through the relay.
func rawProducerConfig(txnID string) *sarama.Config {
	sc := sarama.NewConfig()
	sc.ClientID = "outboxd-bench"
	sc.Version = sarama.V3_6_0_0
	sc.ChannelBufferSize = 1024
	sc.Net.MaxOpenRequests = 1
	sc.Metadata.AllowAutoTopicCreation = false
	sc.Metadata.Full = false
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.Transaction.ID = txnID
	sc.Producer.Transaction.Timeout = time.Minute
	return sc
}

// rawProducer sends the ledger's records the plain way: per transaction,
// begin, send every record, wait for each outcome, commit.
type rawProducer struct {
	ap       sarama.AsyncProducer
	topic    string
	balances []int64
	feed     []byte
	epoch    []byte
}

// runRawProduce measures the relay ceiling: the records the relay would
// publish for the ledger file (key, JSON value, the relay's four headers),
// in transactions of --relay-batch, with no SQLite and no progress record.
func (b *bench) runRawProduce(ctx context.Context) error {
	topic := b.topic("raw")
	if err := b.createTopics(ctx, topic); err != nil {
		return err
	}
	defer b.doneWithTopic(topic)
	ap, err := sarama.NewAsyncProducer(b.brokers, rawProducerConfig(b.prefix+"-raw"))
	if err != nil {
		return fmt.Errorf("start transactional producer: %w", err)
	}
	p := &rawProducer{ap: ap, topic: topic, balances: make([]int64, len(b.data.Names)),
		feed: []byte(rawFeed), epoch: []byte(rawEpoch)}
	defer ap.Close()
	g := newLedgerGen(b.data.Names)
	start := time.Now()
	for left := b.data.Lines; left > 0; left -= int64(b.o.RelayBatch) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.txn(p.messages(g, min(left, int64(b.o.RelayBatch)))); err != nil {
			return err
		}
	}
	b.res.RawProduce = newPhaseResult(b.data.Lines, time.Since(start))
	return nil
}

// messages builds the next n lines' records, as the relay builds them from
// outbox rows.
func (p *rawProducer) messages(g *ledgerGen, n int64) []*sarama.ProducerMessage {
	msgs := make([]*sarama.ProducerMessage, 0, n)
	for range n {
		l, _ := g.next()
		p.balances[l.Account] += l.Amount
		account := g.names[l.Account]
		v, _ := json.Marshal(ledger.Output{Account: account, Amount: l.Amount, Balance: p.balances[l.Account],
			Feed: rawFeed, Epoch: rawEpoch, Position: l.Position}) // cannot fail: plain fields
		msgs = append(msgs, &sarama.ProducerMessage{
			Topic: p.topic, Key: sarama.StringEncoder(account), Value: sarama.ByteEncoder(v), Timestamp: time.Now(),
			Headers: []sarama.RecordHeader{
				{Key: []byte(relay.HeaderID), Value: strconv.AppendInt(nil, l.Index+1, 10)},
				{Key: []byte(relay.HeaderFeed), Value: p.feed},
				{Key: []byte(relay.HeaderEpoch), Value: p.epoch},
				{Key: []byte(relay.HeaderPosition), Value: strconv.AppendInt(nil, l.Position, 10)},
			},
		})
	}
	return msgs
}

// txn sends msgs in one transaction and commits it.
func (p *rawProducer) txn(msgs []*sarama.ProducerMessage) error {
	if err := p.ap.BeginTxn(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	go func() {
		for _, m := range msgs {
			p.ap.Input() <- m
		}
	}()
	var first error
	failed := 0
	for range msgs {
		select {
		case <-p.ap.Successes():
		case pe := <-p.ap.Errors():
			if failed++; first == nil {
				first = pe.Err
			}
		}
	}
	if first != nil {
		err := fmt.Errorf("produce: %d of %d records failed, the first with: %w", failed, len(msgs), first)
		if aerr := p.ap.AbortTxn(); aerr != nil {
			err = errors.Join(err, fmt.Errorf("abort transaction: %w", aerr))
		}
		return err
	}
	if err := p.ap.CommitTxn(); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}
