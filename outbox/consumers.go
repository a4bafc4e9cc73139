package outbox

import (
	"context"
	"fmt"
	"sync"
)

// consumers follows whose progress the backlog and pruning count: the
// Kafka relay's (the largest relay_progress) and each configured sink's
// (sink_progress). Until SetConsumers is called only the relay counts.
type consumers struct {
	mu      sync.Mutex
	set     bool             // SetConsumers was called
	relay   bool             // the Kafka relay counts
	relayAt int64            // the largest relay progress stored
	sinks   map[string]int64 // the configured sinks' stored progress
}

// floor is the last id every counted consumer holds: the smallest of
// their progresses. With none counted (no relay, no sink) it is the
// relay's stored progress, as before any sink.
func (c *consumers) floor() int64 {
	if !c.set || (!c.relay && len(c.sinks) == 0) {
		return c.relayAt
	}
	f := int64(-1)
	if c.relay {
		f = c.relayAt
	}
	for _, at := range c.sinks {
		if f < 0 || at < f {
			f = at
		}
	}
	return f
}

// SetConsumers says whose progress the outbox backlog (PendingBacklog,
// the bound ingest keeps) and pruning (ConsumedThrough) count: the Kafka
// relay's when relay is true, and each sink's of sinks. A sink not named
// does not count, whatever progress it stored: one removed from the
// configuration never holds the outbox back. Call it once the store is
// open, before it serves.
func (s *Store) SetConsumers(ctx context.Context, relay bool, sinks []string) error {
	relayAt, err := publishedThrough(ctx, s.rdb)
	if err != nil {
		return err
	}
	stored, err := s.SinkProgresses(ctx)
	if err != nil {
		return err
	}
	c := &s.consumers
	c.mu.Lock()
	c.set, c.relay, c.relayAt = true, relay, max(c.relayAt, relayAt)
	c.sinks = make(map[string]int64, len(sinks))
	for _, name := range sinks {
		c.sinks[name] = stored[name]
	}
	floor := c.floor()
	c.mu.Unlock()
	if err := s.meter.rebase(ctx, s, floor); err != nil {
		return fmt.Errorf("set the outbox's consumers: %w", err)
	}
	return nil
}

// ConsumedThrough is the last outbox id every counted consumer (see
// SetConsumers) stored as its progress: rows up to it may be pruned.
// Safe for concurrent use.
func (s *Store) ConsumedThrough() int64 {
	c := &s.consumers
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.floor()
}

// relayStored notes a relay's stored progress and moves the backlog on.
func (s *Store) relayStored(lastID int64) {
	c := &s.consumers
	c.mu.Lock()
	c.relayAt = max(c.relayAt, lastID)
	floor := c.floor()
	c.mu.Unlock()
	s.meter.publishedThrough(floor)
}

// sinkStored notes a sink's stored progress and moves the backlog on.
func (s *Store) sinkStored(name string, lastID int64) {
	c := &s.consumers
	c.mu.Lock()
	at, counted := c.sinks[name]
	if !counted {
		c.mu.Unlock()
		return
	}
	c.sinks[name] = max(at, lastID)
	floor := c.floor()
	c.mu.Unlock()
	s.meter.publishedThrough(floor)
}

// rebase makes the meter count from published: lower than it counted
// from (a sink behind the relay), it adds the rows in between, scanned,
// once primed; before, the first PendingBacklog's scan counts them.
func (m *backlogMeter) rebase(ctx context.Context, s *Store, published int64) error {
	m.priming.Lock()
	defer m.priming.Unlock()
	m.mu.Lock()
	primed, old := m.primed, m.published
	m.mu.Unlock()
	switch {
	case published >= old:
		m.publishedThrough(published)
		return nil
	case !primed:
		m.mu.Lock()
		m.published = published // the first count scans from it
		m.mu.Unlock()
		return nil
	}
	marks, err := s.scanBacklog(ctx, published, old)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mk := range marks {
		m.insert(mk)
	}
	m.published = published
	return nil
}
