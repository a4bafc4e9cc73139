package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
)

// txnProducer is the relay's producer: transactional for exactly-once,
// or, without a transactional id, the at-least-once relay's idempotent
// producer, which sends the same record batches the same way with no
// transaction around them (no AddPartitionsToTxn, no EndTxn: a batch is
// published once every record of it is written). It drives Kafka's
// transaction protocol itself, with sarama's client, connections and
// requests: per transaction it adds the transaction's partitions to it
// (AddPartitionsToTxn), sends each partition's records as record batches,
// one produce request per leader, and commits (EndTxn), all on the
// caller's goroutine. sarama's AsyncProducer does the same through a chain
// of goroutines, with a channel send per record at each link, which was
// most of the relay's CPU (figures: docs/performance.md).
//
// Its state (the producer id and epoch, each partition's next sequence)
// lives for one session. After any failure the producer is dropped and
// the next session's InitProducerID fences it and aborts the transaction
// it left open, so no failure is ever retried with a state in doubt.
// Within a transaction, a batch a leader refuses with a retriable code (a
// leader moving, not enough replicas), or whose produce got no answer, is
// sent again with the same sequence, which the broker's deduplication
// makes safe, until the delivery timeout (see produce); a transaction is
// never ended with the producer's epoch while a produce of it is
// unanswered (see doubt).
type txnProducer struct {
	client    sarama.Client
	conf      *sarama.Config
	dialer    *kafkaclient.Dialer // the client's connections, cut by bounded
	txnID     string
	principal string
	// delivery bounds the resends of a batch a leader refuses with a
	// retriable code, and the retries of a busy or moving coordinator
	// (Config.DeliveryTimeout).
	delivery time.Duration
	// resending, when set, is told each failure the producer is about to
	// retry within its transaction, and whether no broker answered.
	resending func(err error, unanswered bool)
	pid       int64
	epoch     int16
	// seq is the next sequence of each partition the producer wrote to.
	seq map[topicPartition]int32
	// maxBatch bounds a record batch as sarama's producer does: the sum
	// of its records' sizes (recordSize) stays below it.
	maxBatch int
	// maxRequest bounds the record bytes of one produce request.
	maxRequest int
	// partitioners holds each topic's partitioner, as the configuration
	// names it; key is the message the partitioner is handed a record's
	// key in (its interface takes a sarama.ProducerMessage), and keyBytes
	// that key.
	partitioners map[string]sarama.Partitioner
	key          sarama.ProducerMessage
	keyBytes     sarama.ByteEncoder
	// parts is the transaction's partitions in the order they first
	// appear, each with its batches; reused like recs.
	parts  []*partBatches
	byTP   map[topicPartition]*partBatches
	broken bool // a transaction failed: only close may follow
	// doubt holds the partitions of this transaction a produce was sent
	// to and never answered (the connection failed, or the answer did not
	// come within the request timeout): the broker may still write that
	// batch, after anything the producer sends with its epoch now. The
	// transaction is then never ended with that epoch: the next
	// producer's initialisation bumps it, which ends the transaction and
	// makes the brokers refuse the late batch (see publishTxn).
	doubt   map[topicPartition]bool
	closeMu sync.Once
}

type topicPartition struct {
	topic     string
	partition int32
}

// partBatches is one partition's records in a transaction: consecutive
// record batches, each within maxBatch.
type partBatches struct {
	tp      topicPartition
	batches []*sarama.RecordBatch
	size    int   // of the last batch, as maxBatch counts it
	first   int64 // the last batch's first timestamp, Unix milliseconds
}

// Request versions, as sarama's own producer picks them for the Kafka
// version the relay's configuration names (3.6); the broker connection
// lowers them to what the broker supports.
const (
	produceVersion            = 9
	initProducerIDVersion     = 3
	addPartitionsToTxnVersion = 3
	endTxnVersion             = 3
)

// Bounds of the retries of a coordinator that is busy or moving: it
// writes the last transaction's markers (CONCURRENT_TRANSACTIONS), loads
// its log, or is elsewhere.
const (
	coordinatorMinBackoff = 5 * time.Millisecond
	coordinatorMaxBackoff = 500 * time.Millisecond
)

// openTxnProducer connects to cfg's brokers with transactional id txnID
// and initialises the producer id, which fences any earlier producer with
// that id and ends the transaction it left open. ctx bounds it.
func openTxnProducer(ctx context.Context, cfg Config, txnID string) (*txnProducer, error) {
	sc := saramaConfig(cfg, txnID)
	d := kafkaclient.NewDialer(sc.Net.DialTimeout)
	d.Use(sc)
	type opened struct {
		p   *txnProducer
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		p, err := newTxnProducer(ctx, cfg.Brokers, sc, cfg.Kafka.Principal(), cfg.DeliveryTimeout)
		ch <- opened{p, err}
	}()
	select {
	case o := <-ch:
		return o.p, o.err
	case <-ctx.Done():
		// Cut the connections, so that the opening ends now and none of
		// its requests reaches a broker after this returns, then wait
		// for it.
		d.CutAll()
		if o := <-ch; o.p != nil {
			o.p.close()
		}
		return nil, ctx.Err()
	}
}

func newTxnProducer(ctx context.Context, brokers []string, sc *sarama.Config, principal string,
	delivery time.Duration) (*txnProducer, error) {
	txnID := sc.Producer.Transaction.ID
	d, ok := sc.Net.Proxy.Dialer.(*kafkaclient.Dialer)
	if !ok || !sc.Net.Proxy.Enable {
		d = kafkaclient.NewDialer(sc.Net.DialTimeout)
		d.Use(sc)
	}
	client, err := sarama.NewClient(brokers, clientConfig(sc))
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	p := &txnProducer{
		client: client, conf: sc, dialer: d, txnID: txnID, principal: principal, delivery: delivery,
		seq:          map[topicPartition]int32{},
		doubt:        map[topicPartition]bool{},
		byTP:         map[topicPartition]*partBatches{},
		partitioners: map[string]sarama.Partitioner{},
		maxBatch:     sc.Producer.MaxMessageBytes,
		maxRequest:   int(sarama.MaxRequestSize) - 10<<10,
	}
	req := &sarama.InitProducerIDRequest{Version: initProducerIDVersion, ProducerID: -1, ProducerEpoch: -1}
	if p.transactional() {
		req.TransactionalID, req.TransactionTimeout = &txnID, sc.Producer.Transaction.Timeout
	}
	var resp *sarama.InitProducerIDResponse
	err = p.coordinated(ctx, func(coord *sarama.Broker) (sarama.KError, error) {
		r, err := coord.InitProducerID(req)
		if err != nil {
			return 0, err
		}
		resp = r
		return r.Err, nil
	})
	if err != nil {
		client.Close()
		err = fmt.Errorf("initialise the producer id: %w", err)
		if !p.transactional() {
			// An idempotent producer id needs IdempotentWrite on the
			// cluster (or Write on some topic).
			return nil, denied(err, principal, ask("IdempotentWrite", ResourceCluster, clusterName))
		}
		// Initialising a producer id needs Write on the transactional id.
		return nil, denied(err, principal, ask("Write", ResourceTransactionalID, txnID))
	}
	p.pid, p.epoch = resp.ProducerID, resp.ProducerEpoch
	return p, nil
}

// maxInFlight is how many produce requests the producer keeps in flight
// on a broker's connection: the most an idempotent producer may (a
// broker keeps the last five batches of each producer and partition to
// tell a resent one).
const maxInFlight = 5

// clientConfig is sc for the producer's client: up to maxInFlight
// requests on a connection. Sarama refuses more than one for an
// idempotent or transactional producer of its own; the client sends
// only what the txnProducer gives it (which keeps each partition's
// batches in sequence order, see produceOnce), so it is told neither.
func clientConfig(sc *sarama.Config) *sarama.Config {
	c := *sc
	c.Net.MaxOpenRequests = maxInFlight
	c.Producer.Idempotent = false
	c.Producer.Transaction.ID = ""
	return &c
}

// transactional says the producer has a transactional id: it publishes in
// transactions (exactly-once). Without one it is the at-least-once
// relay's idempotent producer: the same record batches, no transaction.
func (p *txnProducer) transactional() bool { return p.txnID != "" }

// coordinator is the broker that answers the producer's InitProducerID
// and transaction requests: the transaction coordinator, or any broker
// (the least loaded) for an idempotent producer.
func (p *txnProducer) coordinator() (*sarama.Broker, error) {
	if p.transactional() {
		return p.client.TransactionCoordinator(p.txnID)
	}
	if b := p.client.LeastLoadedBroker(); b != nil {
		return b, nil
	}
	return nil, sarama.ErrOutOfBrokers
}

// coordinated runs req against the transaction coordinator until it
// answers something other than "busy" or "not here": a coordinator
// loading its log or still writing the last transaction's markers is
// asked again after a backoff, a moved one is looked up again (a
// coordinator's failover takes seconds). It gives up once the delivery
// timeout has passed, or when ctx is done.
func (p *txnProducer) coordinated(ctx context.Context, req func(*sarama.Broker) (sarama.KError, error)) error {
	wait := coordinatorMinBackoff
	deadline := time.Now().Add(p.delivery)
	var last error
	for {
		// A request sent once ctx is done could land after the relay
		// stopped: a late InitProducerID would fence the next producer
		// of this transactional id.
		if err := ctx.Err(); err != nil {
			return errors.Join(last, err)
		}
		coord, err := p.coordinator()
		if err != nil {
			err = fmt.Errorf("find the transaction coordinator: %w", err)
			if !coordinatorRetriable(err) {
				return err
			}
			// None known yet (the client's metadata retries are
			// short): looked up again after the backoff.
			last = err
		} else {
			code, err := req(coord)
			switch {
			case err != nil:
				return err
			case code == sarama.ErrNoError:
				return nil
			case code == sarama.ErrNotCoordinatorForConsumer || code == sarama.ErrConsumerCoordinatorNotAvailable:
				last = code
				if !p.transactional() {
					break
				}
				if rerr := p.client.RefreshTransactionCoordinator(p.txnID); rerr != nil {
					last = errors.Join(code, fmt.Errorf("find the transaction coordinator: %w", rerr))
				}
			case code == sarama.ErrConcurrentTransactions || code == sarama.ErrOffsetsLoadInProgress:
				last = code
			default:
				return code
			}
		}
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("%w (still after the delivery timeout, %v)", last, p.delivery)
		}
		p.resent(last)
		select {
		case <-ctx.Done():
			return errors.Join(last, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, coordinatorMaxBackoff)
	}
}

// publishTxn sends recs in one transaction and commits it. A commit that
// fails is ambiguous (*ambiguousError); a produce that fails is not (the
// transaction cannot have committed: the next producer's initialisation
// aborts it), but after an error that may mean "fenced" the producer asks
// the coordinator to abort, whose answer says, unless a produce of the
// transaction is in doubt (see txnProducer.doubt): a broker without
// partition verification (Kafka before 3.6) would append that batch after
// the abort's marker, into a transaction its coordinator no longer knows,
// where it holds back the partition's last stable offset. When ctx is done
// first it returns errAbandoned, with the producer's connections cut: the
// transaction in hand is left to the next producer's initialisation.
func (p *txnProducer) publishTxn(ctx context.Context, recs []*record) error {
	if p.broken {
		return errors.New("the producer failed before: it must be replaced")
	}
	err := p.bounded(ctx, func() error { return p.txn(ctx, recs) })
	if err == nil {
		return nil
	}
	p.broken = true
	var amb *ambiguousError
	if errors.As(err, &amb) || errors.Is(err, errAbandoned) {
		return err
	}
	err = fmt.Errorf("produce: %w", err)
	if !p.transactional() {
		return err // no transaction to end: what went out may go out again
	}
	if len(p.doubt) > 0 {
		return fmt.Errorf("%w (a produce to %s is in doubt: the transaction is left to the next producer's "+
			"initialisation to end)", err, p.doubted())
	}
	if Classify(err) == Ambiguous {
		return p.abort(ctx, err)
	}
	return err
}

// doubted names the partitions in doubt, for an error.
func (p *txnProducer) doubted() string {
	names := make([]string, 0, len(p.doubt))
	for tp := range p.doubt {
		names = append(names, fmt.Sprintf("%s/%d", tp.topic, tp.partition))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// txn is one transaction: its partitions added, its batches sent, its
// commit.
func (p *txnProducer) txn(ctx context.Context, recs []*record) error {
	if err := p.build(recs); err != nil {
		return err
	}
	if p.transactional() {
		if err := p.addPartitions(ctx); err != nil {
			return err
		}
	}
	// Every batch at once, a partition's in sequence order: produce
	// sends a leader's requests one after the other on its connection,
	// without waiting for each answer, so no broker waits for another.
	var sends []sendBatch
	for round := 0; ; round++ {
		n := len(sends)
		for _, pb := range p.parts {
			if round < len(pb.batches) {
				sends = append(sends, sendBatch{tp: pb.tp, batch: pb.batches[round]})
			}
		}
		if len(sends) == n {
			break
		}
	}
	if err := p.produce(ctx, sends); err != nil {
		return err
	}
	if !p.transactional() {
		return nil // every batch written: acked
	}
	err := p.coordinated(ctx, func(coord *sarama.Broker) (sarama.KError, error) {
		r, err := coord.EndTxn(&sarama.EndTxnRequest{Version: endTxnVersion, TransactionalID: p.txnID,
			ProducerID: p.pid, ProducerEpoch: p.epoch, TransactionResult: true})
		if err != nil {
			return 0, err
		}
		return r.Err, nil
	})
	if err != nil {
		return p.commitFailed(err)
	}
	return nil
}

// commitFailed is the error of a commit that failed with err: refused
// (the transaction did not commit, and no retry commits it), fenced, or
// of unknown outcome.
func (p *txnProducer) commitFailed(err error) error {
	err = fmt.Errorf("commit transaction: %w", err)
	if isUnauthorized(err) {
		return denied(err, p.principal, ask("Write", ResourceTransactionalID, p.txnID))
	}
	if isFenced(err) {
		return err
	}
	return &ambiguousError{err}
}

// build sorts recs into their partitions' record batches, in order, with
// the sequences that follow the partitions' last ones. The records
// themselves go into the batches: build sets their timestamp and offset
// deltas.
func (p *txnProducer) build(recs []*record) error {
	clear(p.byTP)
	p.parts = p.parts[:0]
	var topic string
	var ids []int32
	var part sarama.Partitioner
	for i, m := range recs {
		if i == 0 || m.topic != topic {
			var err error
			if topic, ids, part, err = p.topic(m.topic); err != nil {
				return err
			}
		}
		choice, err := p.partition(part, m, int32(len(ids)))
		if err != nil {
			return fmt.Errorf("partition a record of topic %s: %w", topic, err)
		}
		if choice < 0 || int(choice) >= len(ids) {
			return fmt.Errorf("partition a record of topic %s: %w", topic, sarama.ErrInvalidPartition)
		}
		p.add(topicPartition{topic, ids[choice]}, m)
	}
	for _, pb := range p.parts {
		for _, b := range pb.batches {
			n := int32(len(b.Records))
			b.LastOffsetDelta = n - 1
			var most time.Duration
			for j, r := range b.Records {
				r.OffsetDelta = int64(j)
				most = max(most, r.TimestampDelta)
			}
			b.MaxTimestamp = b.FirstTimestamp.Add(most)
			b.FirstSequence = p.seq[pb.tp]
			p.seq[pb.tp] = nextSequence(b.FirstSequence, n)
		}
	}
	return nil
}

// topic returns the partitions of topic as the client last saw them, and
// the partitioner the relay's configuration names, one a topic for the
// producer's life.
func (p *txnProducer) topic(topic string) (string, []int32, sarama.Partitioner, error) {
	ids, err := p.client.Partitions(topic)
	if err != nil {
		return "", nil, nil, fmt.Errorf("partitions of topic %s: %w", topic, err)
	}
	if len(ids) == 0 {
		return "", nil, nil, fmt.Errorf("partitions of topic %s: %w", topic, sarama.ErrUnknownTopicOrPartition)
	}
	part := p.partitioners[topic]
	if part == nil {
		part = p.conf.Producer.Partitioner(topic)
		p.partitioners[topic] = part
	}
	return topic, ids, part, nil
}

// partition is the partition part picks for m of n. A nil key stays a nil
// interface: the partitioner hashes any non-nil key, even an empty one, as
// the Java client does, and spreads the others.
func (p *txnProducer) partition(part sarama.Partitioner, m *record, n int32) (int32, error) {
	p.key.Topic, p.key.Key = m.topic, nil
	if m.rec.Key != nil {
		p.keyBytes = m.rec.Key
		p.key.Key = &p.keyBytes
	}
	choice, err := part.Partition(&p.key, n)
	p.key.Key, p.keyBytes = nil, nil // the record's bytes are not kept
	if err != nil {
		return 0, fmt.Errorf("partitioner: %w", err)
	}
	return choice, nil
}

// add appends m to the last batch of tp, or to a new batch when the last
// one would pass maxBatch.
func (p *txnProducer) add(tp topicPartition, m *record) {
	pb := p.byTP[tp]
	if pb == nil {
		pb = p.partBatches(tp)
	}
	var b *sarama.RecordBatch
	if n := len(pb.batches); n > 0 && pb.size+m.size < p.maxBatch {
		b = pb.batches[n-1]
		pb.size += m.size
	} else {
		b = &sarama.RecordBatch{Version: 2, Codec: p.conf.Producer.Compression,
			CompressionLevel: p.conf.Producer.CompressionLevel, FirstTimestamp: time.UnixMilli(m.at),
			ProducerID: p.pid, ProducerEpoch: p.epoch, IsTransactional: p.transactional()}
		pb.batches = append(pb.batches, b)
		pb.size, pb.first = m.size, m.at
	}
	m.rec.TimestampDelta = time.Duration(m.at-pb.first) * time.Millisecond
	b.Records = append(b.Records, &m.rec)
}

// partBatches starts tp's batches of this transaction.
func (p *txnProducer) partBatches(tp topicPartition) *partBatches {
	var pb *partBatches
	if n := len(p.parts); n < cap(p.parts) && p.parts[:n+1][n] != nil {
		pb = p.parts[:n+1][n]
		pb.tp, pb.batches, pb.size = tp, pb.batches[:0], 0
	} else {
		pb = &partBatches{tp: tp}
	}
	p.parts = append(p.parts, pb)
	p.byTP[tp] = pb
	return pb
}

// nextSequence is the sequence after n records from seq: Kafka's
// sequences wrap to 0 after the largest int32.
func nextSequence(seq, n int32) int32 {
	if seq > math.MaxInt32-n {
		return n - (math.MaxInt32 - seq) - 1
	}
	return seq + n
}

// addPartitions adds the transaction's partitions to it.
func (p *txnProducer) addPartitions(ctx context.Context) error {
	tps := map[string][]int32{}
	for _, pb := range p.parts {
		tps[pb.tp.topic] = append(tps[pb.tp.topic], pb.tp.partition)
	}
	var refused error
	err := p.coordinated(ctx, func(coord *sarama.Broker) (sarama.KError, error) {
		r, err := coord.AddPartitionsToTxn(&sarama.AddPartitionsToTxnRequest{Version: addPartitionsToTxnVersion,
			TransactionalID: p.txnID, ProducerID: p.pid, ProducerEpoch: p.epoch, TopicPartitions: tps})
		if err != nil {
			return 0, err
		}
		// One code for the request: a partition's own refusal (of a
		// topic, named) outranks the codes of the partitions not
		// attempted because of it.
		code := sarama.ErrNoError
		for topic, pes := range r.Errors {
			for _, pe := range pes {
				switch pe.Err {
				case sarama.ErrNoError, sarama.ErrOperationNotAttempted:
				case sarama.ErrTopicAuthorizationFailed:
					refused = denied(fmt.Errorf("add topic %s to the transaction: %w", topic, pe.Err), p.principal,
						ask("Write", ResourceTopic, topic))
					return pe.Err, nil
				default:
					code = pe.Err
				}
			}
		}
		return code, nil
	})
	if refused != nil {
		return refused
	}
	if err != nil {
		return denied(fmt.Errorf("add partitions to the transaction: %w", err), p.principal,
			ask("Write", ResourceTransactionalID, p.txnID))
	}
	return nil
}

// sendBatch is a batch to send and its partition. maybeWritten says an
// earlier send of it in this transaction may have been written: it got no
// answer, or one a broker gives after appending (see checkBlock).
type sendBatch struct {
	tp           topicPartition
	batch        *sarama.RecordBatch
	maybeWritten bool
}

// produce sends batches, a partition's in sequence order, and waits for
// each to be written: one produce request per leader (more when the bytes
// pass maxRequest, or a partition has a batch in the request already),
// the leaders' at once, a leader's up to maxInFlight at a time. A batch refused with a retriable code
// (a leader moving, not enough replicas), or whose partition has no
// leader, or whose request got no answer, is sent again with the same
// sequence (the broker keeps the first of two copies), after a backoff
// from the configuration's retry backoff doubling up to produceMaxBackoff,
// until the delivery timeout has passed since the first send: a broker's
// failover takes seconds.
func (p *txnProducer) produce(ctx context.Context, batches []sendBatch) error {
	deadline := time.Now().Add(p.delivery)
	wait := p.conf.Producer.Retry.Backoff
	for {
		retry, err := p.produceOnce(batches)
		if err != nil || len(retry) == 0 {
			return err
		}
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("%w (still after the delivery timeout, %v)", retry[0].err, p.delivery)
		}
		p.resent(retry[0].err)
		topics := map[string]bool{}
		var names []string
		for _, r := range retry {
			if !topics[r.tp.topic] {
				topics[r.tp.topic] = true
				names = append(names, r.tp.topic)
			}
		}
		select {
		case <-ctx.Done():
			return errors.Join(retry[0].err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, produceMaxBackoff)
		// A failed refresh (no broker answers in a failover) leaves the
		// last metadata: the next round finds out.
		_ = p.client.RefreshMetadata(names...)
		batches = batches[:0]
		for _, r := range retry {
			batches = append(batches, r.sendBatch)
		}
	}
}

// resent tells resending, if set, of err, a failure about to be retried.
func (p *txnProducer) resent(err error) {
	if p.resending != nil {
		p.resending(err, isNetworkError(err) || errors.Is(err, sarama.ErrNotConnected) || errors.Is(err, sarama.ErrOutOfBrokers))
	}
}

// produceMaxBackoff bounds the wait between two sends of a batch.
const produceMaxBackoff = time.Second

// failedBatch is a batch to send again: refused with a retriable code,
// without a leader, or unanswered.
type failedBatch struct {
	sendBatch
	err error
}

// produceOnce sends batches once: it returns those to send again, or the
// first other failure.
func (p *txnProducer) produceOnce(batches []sendBatch) ([]failedBatch, error) {
	brokers, byBroker, leaderless, err := p.requests(batches)
	if err != nil {
		return nil, err
	}
	outcomes := make([]produceOutcome, len(brokers))
	if len(brokers) == 1 {
		outcomes[0] = p.sendAll(byBroker[brokers[0]])
	} else {
		var wg sync.WaitGroup
		for i := range brokers {
			wg.Go(func() { outcomes[i] = p.sendAll(byBroker[brokers[i]]) })
		}
		wg.Wait()
	}
	// Every outcome is looked at before the first failure returns: a
	// broker's batch may be in doubt while another broker failed first.
	retry := leaderless
	var failed error
	for _, o := range outcomes {
		for _, tp := range o.written {
			delete(p.doubt, tp) // the broker keeps one copy of the batch
		}
		for _, b := range o.doubt {
			p.doubt[b.tp] = true
		}
		if o.err != nil && failed == nil {
			failed = o.err
		}
		retry = append(retry, o.retry...)
	}
	if failed != nil {
		return nil, failed
	}
	return retry, nil
}

// produceRequest is one produce request to a leader and its batches.
type produceRequest struct {
	broker *sarama.Broker
	req    *sarama.ProduceRequest
	sent   []sendBatch
	tps    map[topicPartition]bool
	bytes  int
}

// produceOutcome is what one broker's requests came to.
type produceOutcome struct {
	retry   []failedBatch
	err     error
	doubt   []sendBatch // sent, never answered
	written []topicPartition
}

// requests puts batches into produce requests by leader, in order: a
// batch goes into its leader's last request unless that one holds its
// partition already (a request carries one batch a partition) or would
// pass maxRequest. It returns the leaders in the order first met, their
// requests, and the batches whose partition has no leader now.
func (p *txnProducer) requests(batches []sendBatch) ([]*sarama.Broker, map[*sarama.Broker][]*produceRequest, []failedBatch, error) {
	var brokers []*sarama.Broker
	byBroker := map[*sarama.Broker][]*produceRequest{}
	var leaderless []failedBatch
	stuck := map[topicPartition]error{} // leaderless: its later batches wait too
	for _, b := range batches {
		if err := stuck[b.tp]; err != nil {
			leaderless = append(leaderless, failedBatch{b, err})
			continue
		}
		leader, err := p.client.Leader(b.tp.topic, b.tp.partition)
		if err != nil {
			if !leaderRetriable(err) {
				return nil, nil, nil, fmt.Errorf("leader of %s/%d: %w", b.tp.topic, b.tp.partition, err)
			}
			stuck[b.tp] = fmt.Errorf("leader of %s/%d: %w", b.tp.topic, b.tp.partition, err)
			leaderless = append(leaderless, failedBatch{b, stuck[b.tp]})
			continue
		}
		size := batchBytes(b.batch)
		rqs := byBroker[leader]
		if rqs == nil {
			brokers = append(brokers, leader)
		}
		var rq *produceRequest
		if n := len(rqs); n > 0 {
			rq = rqs[n-1]
		}
		if rq == nil || rq.tps[b.tp] || (rq.bytes > 0 && rq.bytes+size > p.maxRequest) {
			rq = &produceRequest{broker: leader, tps: map[topicPartition]bool{}, req: &sarama.ProduceRequest{
				RequiredAcks: p.conf.Producer.RequiredAcks,
				Timeout:      int32(p.conf.Producer.Timeout / time.Millisecond), Version: produceVersion}}
			if p.transactional() {
				rq.req.TransactionalID = &p.txnID
			}
			byBroker[leader] = append(rqs, rq)
		}
		rq.req.AddBatch(b.tp.topic, b.tp.partition, b.batch)
		rq.sent = append(rq.sent, b)
		rq.tps[b.tp] = true
		rq.bytes += size
	}
	return brokers, byBroker, leaderless, nil
}

// produceAnswer is a produce request's response, or why none came.
type produceAnswer struct {
	resp *sarama.ProduceResponse
	err  error
}

// sendAll sends one broker's requests in order on its connection, up to
// maxInFlight unanswered (the broker answers them in order), and reads
// every answer. A partition's later batch that the broker refuses as out
// of order because an earlier one of this call was not written is sent
// again with it.
func (p *txnProducer) sendAll(rqs []*produceRequest) produceOutcome {
	var o produceOutcome
	answers := make([]chan produceAnswer, 0, len(rqs))
	var unsent error // why the request after the last sent could not go
	for _, rq := range rqs {
		ch := make(chan produceAnswer, 1)
		// The callback runs on the connection's reading goroutine: it
		// only hands the answer over.
		err := rq.broker.AsyncProduce(rq.req, func(resp *sarama.ProduceResponse, err error) {
			ch <- produceAnswer{resp, err}
		})
		if err != nil {
			unsent = fmt.Errorf("produce to broker %s: %w", rq.broker.Addr(), err)
			break
		}
		answers = append(answers, ch)
	}
	behind := map[topicPartition]bool{} // a batch of it was not written
	for j, ch := range answers {
		a := <-ch
		p.answered(&o, rqs[j], a, behind)
	}
	if unsent != nil {
		// The request that failed to go out may be written in part, as
		// one unanswered; those after it never left.
		failed := rqs[len(answers)]
		o.doubt = append(o.doubt, failed.sent...)
		if !isNetworkError(unsent) && !errors.Is(unsent, sarama.ErrNotConnected) {
			o.err = cmp.Or(o.err, unsent)
			return o
		}
		for k, later := range rqs[len(answers):] {
			for _, b := range later.sent {
				b.maybeWritten = b.maybeWritten || k == 0
				o.retry = append(o.retry, failedBatch{b, unsent})
			}
		}
	}
	return o
}

// answered takes rq's answer a into o. behind holds the partitions of
// which a batch sent before was not written (to be sent again).
func (p *txnProducer) answered(o *produceOutcome, rq *produceRequest, a produceAnswer, behind map[topicPartition]bool) {
	if a.err != nil {
		// Unanswered: sent again, and in doubt until a later send of
		// the same batch is answered written.
		err := fmt.Errorf("produce to broker %s: %w", rq.broker.Addr(), a.err)
		o.doubt = append(o.doubt, rq.sent...)
		if !isNetworkError(err) && !errors.Is(err, sarama.ErrNotConnected) {
			o.err = cmp.Or(o.err, err)
			return
		}
		for _, b := range rq.sent {
			b.maybeWritten = true
			o.retry = append(o.retry, failedBatch{b, err})
			behind[b.tp] = true
		}
		return
	}
	for _, b := range rq.sent {
		if behind[b.tp] {
			if block := a.resp.GetBlock(b.tp.topic, b.tp.partition); block != nil && block.Err == sarama.ErrOutOfOrderSequenceNumber {
				// Its partition's batch before it was not written: the
				// broker took none after it.
				o.retry = append(o.retry, failedBatch{b, fmt.Errorf("produce to %s/%d: %w after a batch not written",
					b.tp.topic, b.tp.partition, block.Err)})
				continue
			}
		}
		retry, err := p.checkBlock(a.resp, b)
		switch {
		case err != nil:
			o.err = cmp.Or(o.err, err)
		case retry != nil:
			o.retry = append(o.retry, *retry)
			behind[b.tp] = true
		default:
			o.written = append(o.written, b.tp)
		}
	}
}

// checkBlock reads b's answer in resp: written, to be sent again, or a
// failure.
func (p *txnProducer) checkBlock(resp *sarama.ProduceResponse, b sendBatch) (*failedBatch, error) {
	block := resp.GetBlock(b.tp.topic, b.tp.partition)
	if block == nil {
		return nil, fmt.Errorf("produce to %s/%d: %w", b.tp.topic, b.tp.partition, sarama.ErrIncompleteResponse)
	}
	switch code := block.Err; {
	case code == sarama.ErrNoError:
		return nil, nil
	case code == sarama.ErrDuplicateSequenceNumber && b.maybeWritten:
		// A batch sent again that the broker had written before: it
		// keeps the first.
		return nil, nil
	case code == sarama.ErrDuplicateSequenceNumber:
		// A batch never sent, or only refused, before cannot be a
		// duplicate: the broker's view of the producer's sequences is
		// not ours, and taking it as written would drop its records. The
		// session ends (Ambiguous).
		return nil, fmt.Errorf("produce to %s/%d: %w on a batch not written before", b.tp.topic, b.tp.partition, code)
	case isRetriableCode(code) && code != sarama.ErrInvalidMessage:
		// These a broker answers after appending the batch.
		b.maybeWritten = b.maybeWritten || code == sarama.ErrRequestTimedOut ||
			code == sarama.ErrNotEnoughReplicasAfterAppend || code == sarama.ErrNetworkException
		return &failedBatch{b, fmt.Errorf("produce to %s/%d: %w", b.tp.topic, b.tp.partition, code)}, nil
	default:
		err := fmt.Errorf("produce to %s/%d: %w", b.tp.topic, b.tp.partition, code)
		return nil, denied(err, p.principal, ask("Write", ResourceTopic, b.tp.topic),
			ask("Write", ResourceTransactionalID, p.txnID))
	}
}

// coordinatorRetriable reports an error of looking up the transaction
// coordinator that a failover explains.
func coordinatorRetriable(err error) bool {
	return errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable) || errors.Is(err, sarama.ErrNotCoordinatorForConsumer) ||
		errors.Is(err, sarama.ErrOffsetsLoadInProgress) || errors.Is(err, sarama.ErrOutOfBrokers) ||
		errors.Is(err, sarama.ErrBrokerNotAvailable) || isNetworkError(err)
}

// leaderRetriable reports an error of looking up a partition's leader
// that a failover explains: none elected yet, or not in the metadata the
// client has.
func leaderRetriable(err error) bool {
	return errors.Is(err, sarama.ErrLeaderNotAvailable) || errors.Is(err, sarama.ErrUnknownTopicOrPartition) ||
		errors.Is(err, sarama.ErrNotLeaderForPartition) || errors.Is(err, sarama.ErrBrokerNotAvailable) ||
		isNetworkError(err) || errors.Is(err, sarama.ErrOutOfBrokers)
}

// batchBytes is b's records' bytes as maxRequest counts them, before
// compression.
func batchBytes(b *sarama.RecordBatch) int {
	n := 0
	for _, r := range b.Records {
		n += len(r.Key) + len(r.Value) + 16
		for _, h := range r.Headers {
			n += len(h.Key) + len(h.Value) + 2
		}
	}
	return n
}

// abortTimeout bounds the abort made to learn whether the producer is fenced.
const abortTimeout = 3 * time.Second

// abort asks the coordinator to abort the transaction; its answer tells a
// fenced producer (PRODUCER_FENCED) from one whose records merely failed.
func (p *txnProducer) abort(ctx context.Context, cause error) error {
	if ctx.Err() != nil {
		return cause
	}
	ctx, cancel := context.WithTimeout(ctx, abortTimeout)
	defer cancel()
	err := p.bounded(ctx, func() error {
		return p.coordinated(ctx, func(coord *sarama.Broker) (sarama.KError, error) {
			r, err := coord.EndTxn(&sarama.EndTxnRequest{Version: endTxnVersion, TransactionalID: p.txnID,
				ProducerID: p.pid, ProducerEpoch: p.epoch, TransactionResult: false})
			if err != nil {
				return 0, err
			}
			return r.Err, nil
		})
	})
	if err != nil {
		return errors.Join(cause, fmt.Errorf("abort transaction: %w", err))
	}
	return cause
}

// bounded runs f, and when ctx is done first cuts the producer's
// connections, which ends f at once, waits for it and returns
// errAbandoned. Nothing f sends reaches a broker after bounded returns,
// and no goroutine is left behind; the producer is closed next.
func (p *txnProducer) bounded(ctx context.Context, f func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		p.dialer.CutAll()
		<-ch
		return fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
	}
}

// close closes the producer's connections. A transaction in flight fails;
// the next producer's initialisation aborts it.
func (p *txnProducer) close() {
	p.closeMu.Do(func() { _ = p.client.Close() })
}

// Producer is the exactly-once relay's transactional producer, for a tool
// that must produce as the relay does (the bench's ceilings): the same
// configuration, the same requests, one transaction per Publish.
type Producer struct{ p *txnProducer }

// OpenProducer connects to cfg's brokers as the relay's exactly-once
// producer does, with transactional id txnID, and initialises its producer
// id (which fences an earlier producer with that id). ctx bounds it.
func OpenProducer(ctx context.Context, cfg Config, txnID string) (*Producer, error) {
	p, err := openTxnProducer(ctx, cfg, txnID)
	if err != nil {
		return nil, fmt.Errorf("start transactional producer %s: %w", txnID, err)
	}
	return &Producer{p}, nil
}

// Publish sends msgs in one transaction and commits it, each message as
// the record the relay would make of it (a message without a timestamp is
// stamped now). After an error the producer is of no more use: close it
// and open another.
func (p *Producer) Publish(ctx context.Context, msgs []*sarama.ProducerMessage) error {
	recs := make([]*record, len(msgs))
	for i, m := range msgs {
		rec, err := producerRecord(m)
		if err != nil {
			return err
		}
		recs[i] = rec
	}
	return p.p.publishTxn(ctx, recs)
}

// Close closes the producer's connections.
func (p *Producer) Close() { p.p.close() }
