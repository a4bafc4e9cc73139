// Package orders is the built-in processor of order events: it keeps each
// order's events and status in the store and emits every change of status,
// exactly once, whatever order the events come in.
//
// An event is a Kafka record keyed by the order id, whose value is a JSON
// object {"type": ..., "at": RFC 3339 time, ...}. Types are placed, paid,
// shipped, delivered and cancelled; an order goes placed -> paid -> shipped
// -> delivered, and may be cancelled while placed or paid (see Next).
//
// Each event is folded into its order's history, ordered by at (see Fold).
// When the state machine accepts the history, the event and the order's new
// status are stored and each change is emitted to Config.StatusTopic, in the
// transaction that moves the feed's position past the event. When it
// refuses it, an earlier event may still be on its way: the event goes to
// Config.RetryTopic (through the outbox, in the same transaction) and comes
// back after Config.RetryDelay, doubling each time; once
// Config.RetryAttempts are spent it is dead-lettered with reason
// invalid-transition. Every event is keyed by its original place (topic
// incarnation, partition, offset), so one that comes back after being
// applied changes nothing.
//
// Bad input is dead-lettered at once: ReasonMalformed, ReasonUnknownType.
package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Name is the processor's name on the command line.
const Name = "orders"

// Defaults of Config.
const (
	DefaultRetryDelay    = time.Second
	DefaultRetryAttempts = 5
	// DefaultWorkDeadline bounds the work on one record. It is shorter
	// than the server's default shutdown grace period (20s), so a SIGTERM
	// never finds a record it cannot finish.
	DefaultWorkDeadline = 15 * time.Second
)

// Config configures the processor.
type Config struct {
	// SourceTopic is the topic the feed reads events from (its main
	// topic): the topic of their original place. Required.
	SourceTopic string
	// StatusTopic receives the status changes (NAME.status). Required.
	StatusTopic string
	// RetryTopic receives events the state machine refused, to come back
	// (NAME.retry); the feed must read it as an extra topic. Empty: such
	// events are dead-lettered at once.
	RetryTopic string
	// RetryDelay is the wait before the first retry; each retry after it
	// waits twice as long as the one before.
	RetryDelay time.Duration
	// RetryAttempts is how many times an event is tried, the first
	// included, before it is dead-lettered as invalid-transition.
	RetryAttempts int
	// WorkDeadline bounds the work on one record.
	WorkDeadline time.Duration
	// Now tells the time for due times (default time.Now).
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults for the feed named name reading
// sourceTopic: changes to NAME.status, retries through NAME.retry.
func DefaultConfig(name, sourceTopic string) Config {
	return Config{
		SourceTopic:   sourceTopic,
		StatusTopic:   name + ".status",
		RetryTopic:    name + ".retry",
		RetryDelay:    DefaultRetryDelay,
		RetryAttempts: DefaultRetryAttempts,
		WorkDeadline:  DefaultWorkDeadline,
	}
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.SourceTopic == "":
		return errors.New("orders: no source topic")
	case c.StatusTopic == "":
		return errors.New("orders: no status topic")
	case c.RetryTopic != "" && (c.RetryTopic == c.StatusTopic || c.RetryTopic == c.SourceTopic):
		return fmt.Errorf("orders: retry topic %q is also the source or status topic", c.RetryTopic)
	case c.RetryDelay <= 0:
		return fmt.Errorf("orders: retry delay %v, want more than 0", c.RetryDelay)
	case c.RetryAttempts < 1:
		return fmt.Errorf("orders: retry attempts %d, want at least 1", c.RetryAttempts)
	case c.WorkDeadline <= 0:
		return fmt.Errorf("orders: work deadline %v, want more than 0", c.WorkDeadline)
	}
	return nil
}

// Processor is the orders processor. Its state is kept per feed, so one
// Processor may serve several feeds; Apply is called by one goroutine per
// feed.
//
// During a transaction it keeps the orders the transaction's items read
// and changed in memory, reads those a batch needs in a few key-ordered
// statements before its first item (Prepare), and writes what changed
// when the batch commits (Tx.BeforeCommit), in key order. Nothing is kept
// from one transaction to the next, and within one only the processor
// writes its tables, so what it holds is what they would hold.
type Processor struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	b  *batch // the transaction in hand
}

var (
	_ ingest.Processor = (*Processor)(nil)
	_ ingest.Setupper  = (*Processor)(nil)
	_ ingest.Preparer  = (*Processor)(nil)
)

// New checks cfg and returns a processor.
func New(cfg Config) (*Processor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Processor{cfg: cfg, log: cfg.Logger.With("component", "orders")}, nil
}

// Setup creates the processor's tables when they do not exist.
func (p *Processor) Setup(ctx context.Context, tx *outbox.Tx) error {
	if _, err := tx.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create the orders tables: %w", err)
	}
	return nil
}

// Apply folds the record's event into its order (see the package doc). It
// returns an error wrapped by ingest.Permanent for a record to dead-letter,
// and other errors (the store's) as transient. Nothing is kept when it
// returns an error: the event is stored at the transaction's commit, or
// not at all when the item is rolled back.
func (p *Processor) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	e, reason, err := Decode(item.Key, item.Value)
	if err != nil {
		return ingest.Permanent(reason, err)
	}
	if tx.Store().Postgres() && !pgKey(item.Key) {
		return ingest.Malformed("the key %q is no order id a PostgreSQL store can keep: text is UTF-8 without NUL there", item.Key)
	}
	from, attempt, err := p.origin(d, item)
	if err != nil {
		return err // a retry record without its origin: permanent, malformed
	}
	e.Place = from
	// The deadline bounds the reads; an event whose order is in memory
	// needs none.
	w := deadline{parent: ctx, d: p.cfg.WorkDeadline}
	defer w.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.batchOf(tx)
	if done, err := b.applied(&w, d.Feed, from); err != nil || done {
		return err
	}
	s, err := b.order(&w, d.Feed, e.OrderID)
	if err != nil {
		return err
	}
	hist := s.history()
	if duplicate(hist, e) {
		return nil
	}
	status, changes, err := Fold(hist, e)
	if errors.Is(err, ErrInvalidTransition) {
		return p.refused(ctx, tx, item, e, attempt, err)
	}
	if err != nil {
		return err
	}
	if err := p.emit(ctx, tx, e.OrderID, item.Key, changes); err != nil {
		return err
	}
	tx.OnRollbackItem(b.add(d.Feed, s, e, status, changes[len(changes)-1].At))
	return nil
}

// batchOf returns the state of transaction tx, starting it when tx is new:
// what an earlier transaction left never committed, so it is dropped.
// p.mu is held.
func (p *Processor) batchOf(tx *outbox.Tx) *batch {
	if p.b != nil && p.b.tx == tx {
		return p.b
	}
	b := newBatch(tx)
	p.b = b
	tx.BeforeCommit(b.write)
	tx.OnCommit(func() { p.forget(b) })
	return b
}

// forget lets a committed transaction's state go.
func (p *Processor) forget(b *batch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.b == b {
		p.b = nil
	}
}

// deadline is the context of one record's reads, made when the first one
// needs it.
type deadline struct {
	parent context.Context
	d      time.Duration
	ctx    context.Context
	cancel context.CancelFunc
}

func (w *deadline) get() context.Context {
	if w.ctx == nil {
		w.ctx, w.cancel = context.WithTimeout(w.parent, w.d)
	}
	return w.ctx
}

func (w *deadline) stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

// applied reports whether the event first read at pl is stored, as the
// transaction has left orders_events: added by it, or stored before it
// and not compacted by it. An offset past the epoch's last stored one
// (the case of every event read for the first time) needs no lookup.
func (b *batch) applied(w *deadline, feed string, pl Place) (bool, error) {
	if _, ok := b.fresh[freshPlace(feed, pl)]; ok {
		return true, nil
	}
	ek := epochKey{feed, pl.Epoch}
	last, ok := b.last[ek]
	if !ok {
		var err error
		if last, err = lastOffset(w.get(), b.tx, feed, pl.Epoch); err != nil {
			return false, err
		}
		b.last[ek] = last
	}
	if pl.Offset > last {
		return false, nil
	}
	id, ok, err := placeOrder(w.get(), b.tx, feed, pl)
	if err != nil || !ok {
		return false, err
	}
	if s := b.orders[orderKey{feed, id}]; s != nil && s.dropStored {
		return false, nil // compacted by this transaction
	}
	return true, nil
}

// order returns the order's state, reading it when the transaction does
// not hold it yet.
func (b *batch) order(w *deadline, feed, id string) (*orderState, error) {
	k := orderKey{feed, id}
	if s := b.orders[k]; s != nil {
		return s, nil
	}
	s, err := readHistory(w.get(), b.tx, feed, id)
	if err != nil {
		return nil, err
	}
	b.orders[k] = s
	return s, nil
}

// duplicate reports whether history holds an event of e's type at e's time:
// the same event sent twice upstream, which changes nothing.
func duplicate(history []Event, e Event) bool {
	for _, h := range history {
		if h.Type == e.Type && h.At.Equal(e.At) {
			return true
		}
	}
	return false
}

// refused sends an event the state machine refused to the retry topic, or
// dead-letters it when its attempts are spent.
func (p *Processor) refused(ctx context.Context, tx *outbox.Tx, item ingest.Item, e Event, attempt int, cause error) error {
	if p.cfg.RetryTopic == "" || attempt >= p.cfg.RetryAttempts {
		// The rounds through the retry topic are the event's attempts.
		return ingest.PermanentAfter(ReasonInvalidTransition, attempt, fmt.Errorf("after %d attempts: %w", attempt, cause))
	}
	p.log.Debug("event refused: retrying it later", "order", e.OrderID, "type", e.Type,
		"epoch", e.Place.Epoch, "offset", e.Place.Offset, "attempt", attempt+1, "err", cause)
	return p.retry(ctx, tx, item, e.Place, attempt+1)
}

// StatusChange is the JSON value of a record of the status topic. Previous
// is "" for an order's first status; At is the time of the event that made
// the change.
type StatusChange struct {
	OrderID  string    `json:"order_id"`
	Status   Status    `json:"status"`
	Previous Status    `json:"previous"`
	At       time.Time `json:"at"`
}

// emit writes each change to the status topic, keyed by the order id.
func (p *Processor) emit(ctx context.Context, tx *outbox.Tx, orderID string, key []byte, changes []Change) error {
	for _, c := range changes {
		v, err := json.Marshal(StatusChange{OrderID: orderID, Status: c.Status, Previous: c.Previous, At: c.At.UTC()})
		if err != nil {
			return fmt.Errorf("encode status change of order %s: %w", orderID, err)
		}
		if err := tx.Emit(ctx, outbox.Output{Topic: p.cfg.StatusTopic, Key: key, Value: v}); err != nil {
			return err
		}
	}
	return nil
}
