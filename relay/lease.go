package relay

// The relay's leader, when servers share the database.
//
// Servers that share one database (consumer group feeds, see
// outbox/partowner.go) share one outbox, and it must be published once. So
// one relay publishes it at a time: the leader, which holds the lease
// "relay" in the store, a row with its holder, a term bumped at every
// taking, and an expiry it renews every third of the lease. A server whose
// lease expired unrenewed (dead, paused, cut off from the database) loses
// it: another server's relay takes it, with the next term.
//
// A lease alone cannot stop a paused leader from publishing once it wakes
// up. Kafka does: every relay of the database uses one transactional id
// (the database's, as for a single server), so the new leader's
// InitProducerID bumps the id's producer epoch and aborts the transaction
// the old one had open; the old one's next produce or commit is refused
// (ErrFenced), and it goes back to waiting for the lease. And the new
// leader resumes from the progress committed in Kafka's transactions, so
// every output is published once across the change.
//
// Why one transactional id per database and a lease, rather than one
// transactional id per shard (as Kafka Connect gives each task one,
// KIP-618): the outbox is one sequence of ids, in commit order, whatever
// partition of the feed made each row; the relay's progress is one id in
// it. Shards of the relay would each need a progress of their own and a
// split of the outbox that follows the feed's partitions, so a partition
// that moves between servers would move its outbox rows' publication in
// the middle of a sequence. With one leader the outbox and its progress
// stay as they are for one server, and fencing is Kafka's own, per id.
// The cost is that one server publishes for all: the relay's rate is one
// server's (see docs/cluster.md for the figures).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox"
)

// LeaseName is the name of the relay leader's lease in the store.
const LeaseName = "relay"

// DefaultLeaseTTL is a relay lease's default length.
const DefaultLeaseTTL = 5 * time.Second

// Leader runs a relay only while its server holds the relay's lease.
type Leader struct {
	relay  *Relay
	store  *outbox.Store
	holder string
	ttl    time.Duration
	log    *slog.Logger

	mu     sync.Mutex
	term   int64 // the term held, 0 when none
	paused atomic.Bool
}

// NewLeader returns a leader that runs r while holder holds the relay's
// lease in store, each taking or renewal good for ttl (DefaultLeaseTTL
// when 0).
func NewLeader(r *Relay, store *outbox.Store, holder string, ttl time.Duration, log *slog.Logger) *Leader {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	if log == nil {
		log = slog.Default()
	}
	return &Leader{relay: r, store: store, holder: holder, ttl: ttl,
		log: log.With("component", "relay-leader", "server", holder)}
}

// Term returns the lease's term this server holds, 0 when it holds none.
func (l *Leader) Term() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term
}

func (l *Leader) setTerm(t int64) {
	l.mu.Lock()
	l.term = t
	l.mu.Unlock()
}

// Run waits for the lease, runs the relay while it holds it, and waits
// again once it lost it (the lease renewed no more, or the relay fenced by
// the next leader), until ctx is done: then the relay stops as Relay.Run
// does, the lease is released, and Run returns nil. It returns the
// relay's error when the relay must not go on without an operator
// (ErrBackInTime, say).
func (l *Leader) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		term, ok, err := l.store.AcquireLease(ctx, LeaseName, l.holder, l.ttl)
		if err != nil {
			l.log.Warn("taking the relay's lease (will retry)", "err", err)
		}
		if !ok {
			if clock.Sleep(ctx, l.ttl/3) != nil {
				return nil
			}
			continue
		}
		l.setTerm(term)
		l.log.Info("relay lease taken: this server relays the outbox", "term", term)
		err = l.lead(ctx, term)
		l.setTerm(0)
		switch {
		case ctx.Err() != nil:
			if rerr := l.store.ReleaseLease(context.WithoutCancel(ctx), LeaseName, l.holder, term); rerr != nil {
				l.log.Warn("releasing the relay's lease", "err", rerr)
			}
			return nil
		case errors.Is(err, ErrFenced):
			l.log.Warn("the relay was fenced by the next leader: waiting for the lease", "term", term, "err", err)
		case err != nil:
			return err
		default:
			l.log.Warn("the relay's lease was lost: the relay stopped, waiting for the lease", "term", term)
		}
	}
	return nil
}

// lead runs the relay for term, renewing the lease, until the relay ends,
// the lease is lost, or ctx is done.
func (l *Leader) lead(ctx context.Context, term int64) error {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- l.relay.Run(runCtx) }()
	tick := time.NewTicker(l.ttl / 3)
	defer tick.Stop()
	renewed := time.Now()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
		}
		if l.paused.Load() {
			continue // as a paused process: no renewal, no look at the lease
		}
		ok, err := l.store.RenewLease(ctx, LeaseName, l.holder, term, l.ttl)
		switch {
		case err == nil && ok:
			renewed = time.Now()
			continue
		case err == nil:
			l.log.Warn("the relay's lease has another holder now", "term", term)
		case time.Since(renewed) < l.ttl:
			l.log.Warn("renewing the relay's lease (will retry)", "term", term, "err", err)
			continue
		default:
			l.log.Warn("the relay's lease expired unrenewed", "term", term, "err", err)
		}
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("relay stopped on losing its lease: %w", err)
		}
		return nil
	}
}
