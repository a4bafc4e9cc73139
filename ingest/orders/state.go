package orders

import (
	"cmp"
	"slices"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// orderKey names an order of a feed.
type orderKey struct{ feed, id string }

func compareOrderKeys(a, b orderKey) int {
	return cmp.Or(cmp.Compare(a.feed, b.feed), cmp.Compare(a.id, b.id))
}

// placeKey names the place an event was first read at, in a feed.
type placeKey struct {
	feed, epoch string
	offset      int64
}

// epochKey names an epoch of a feed.
type epochKey struct{ feed, epoch string }

// orderState is one order's stored state as the items applied so far in
// the transaction left it: what its rows of orders_events and orders_done
// hold, and what the transaction's commit must write. Its slices are never
// changed in place once set (an item's undo keeps the state before it).
type orderState struct {
	// stored are its rows of orders_events from before the transaction
	// that are still there, fresh those the transaction added; both in
	// primary-key order (epoch, offset).
	stored, fresh []Event
	// done is its compacted history, in the order of orders_done's array.
	done []Event
	// dropStored: the transaction compacted the order, so the rows of
	// orders_events it had before the transaction are to be deleted.
	dropStored bool
	doneDirty  bool // done is to be written
	// The status to write, when events > 0: the transaction applied that
	// many of the order's events.
	status   Status
	statusAt time.Time
	events   int64
}

// open returns the order's rows of orders_events, in primary-key order.
func (s *orderState) open() []Event {
	if len(s.fresh) == 0 {
		return s.stored
	}
	if len(s.stored) == 0 {
		return s.fresh
	}
	open := append(slices.Clone(s.stored), s.fresh...)
	slices.SortFunc(open, comparePlaces)
	return open
}

// history is what the fold reads: the open events, then the compacted
// ones.
func (s *orderState) history() []Event {
	open := s.open()
	if len(s.done) == 0 {
		return open
	}
	if len(open) == 0 {
		return s.done
	}
	return append(slices.Clone(open), s.done...)
}

// comparePlaces orders events as orders_events' primary key does within
// one order: by epoch, then offset (bytewise, SQLite's BINARY collation).
func comparePlaces(a, b Event) int { return a.Place.compare(b.Place) }

// batch is the processor's state during one transaction: the orders it
// read or changed, and the places of the events it added.
type batch struct {
	tx     *outbox.Tx
	orders map[orderKey]*orderState
	// fresh holds the places of the open events the transaction added.
	fresh map[placeKey]struct{}
	// last is, per feed and epoch, the highest offset of the open events
	// stored before the transaction (-1: none), as far as it was needed.
	last map[epochKey]int64
}

func newBatch(tx *outbox.Tx) *batch {
	return &batch{tx: tx, orders: map[orderKey]*orderState{}, fresh: map[placeKey]struct{}{}, last: map[epochKey]int64{}}
}

func freshPlace(feed string, p Place) placeKey { return placeKey{feed, p.Epoch, p.Offset} }

// add stores e in its order's state, with the order's new status set by
// an event at statusAt, compacting the order when the status finishes
// it; it returns the function that takes it back.
func (b *batch) add(feed string, s *orderState, e Event, status Status, statusAt time.Time) (undo func()) {
	prev := *s
	fresh := make([]Event, 0, len(s.fresh)+1)
	fresh = append(fresh, s.fresh...)
	i, _ := slices.BinarySearchFunc(fresh, e, comparePlaces)
	s.fresh = slices.Insert(fresh, i, e)
	b.fresh[freshPlace(feed, e.Place)] = struct{}{}
	s.status, s.statusAt, s.events = status, statusAt, s.events+1
	if finished(status) {
		b.compact(feed, s)
	}
	return func() {
		for _, f := range s.fresh {
			delete(b.fresh, freshPlace(feed, f.Place))
		}
		*s = prev
		for _, f := range s.fresh {
			b.fresh[freshPlace(feed, f.Place)] = struct{}{}
		}
	}
}

// compact moves the order's open events into its compacted history, as
// orders_done keeps it: the open events, then those compacted before.
func (b *batch) compact(feed string, s *orderState) {
	s.done = s.history()
	s.dropStored = s.dropStored || len(s.stored) > 0
	for _, f := range s.fresh {
		delete(b.fresh, freshPlace(feed, f.Place))
	}
	s.stored, s.fresh, s.doneDirty = nil, nil, true
}

// finished reports whether an order in status s is compacted.
func finished(s Status) bool { return s == Delivered || s == Cancelled }
