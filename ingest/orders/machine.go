package orders

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Status is an order's status; None before its first event.
type Status string

// The statuses an order goes through. Each event type sets the status of
// the same name.
const (
	None      Status = ""
	Placed    Status = "placed"
	Paid      Status = "paid"
	Shipped   Status = "shipped"
	Delivered Status = "delivered"
	Cancelled Status = "cancelled"
)

// transitions maps each event type to the statuses it may follow: an order
// is placed, paid, shipped, delivered; it may be cancelled while placed or
// paid.
var transitions = map[string][]Status{
	string(Placed):    {None},
	string(Paid):      {Placed},
	string(Shipped):   {Paid},
	string(Delivered): {Shipped},
	string(Cancelled): {Placed, Paid},
}

// KnownType reports whether the state machine knows the event type.
func KnownType(typ string) bool {
	_, ok := transitions[typ]
	return ok
}

// ErrInvalidTransition is returned (wrapped) for a history the state
// machine refuses.
var ErrInvalidTransition = errors.New("invalid transition")

// Next returns the status an event of type typ moves an order in status
// from to, or an error wrapping ErrInvalidTransition.
func Next(from Status, typ string) (Status, error) {
	froms, ok := transitions[typ]
	if !ok {
		return from, fmt.Errorf("%w: unknown event type %q", ErrInvalidTransition, typ)
	}
	if !slices.Contains(froms, from) {
		return from, fmt.Errorf("%w: %s cannot follow %s", ErrInvalidTransition, typ, describe(from))
	}
	return Status(typ), nil
}

func describe(s Status) string {
	if s == None {
		return "no earlier event"
	}
	return string(s)
}

// Change is one change of an order's status.
type Change struct {
	Status   Status
	Previous Status
	At       time.Time // of the event that made it
}

// Fold folds e into the history of its order: it orders history and e by
// time (then by place, for events at the same time) and runs the state
// machine over them from no status. It returns the order's status after
// them, and the changes from e on: e's own change and, when e is older than
// events already in the history, the changes of those later events too,
// whose previous status it altered (each the same as it was before, or
// with a new previous). It returns an error wrapping ErrInvalidTransition
// when the state machine refuses the folded history; history itself is
// taken as one the machine accepted.
func Fold(history []Event, e Event) (Status, []Change, error) {
	events := append(slices.Clone(history), e)
	slices.SortStableFunc(events, compareEvents)
	status := None
	var changes []Change
	after := false
	for _, ev := range events {
		next, err := Next(status, ev.Type)
		if err != nil {
			return status, nil, fmt.Errorf("order %s: %s at %s: %w", e.OrderID, ev.Type, ev.At.Format(time.RFC3339Nano), err)
		}
		after = after || ev.Place == e.Place
		if after {
			changes = append(changes, Change{Status: next, Previous: status, At: ev.At})
		}
		status = next
	}
	return status, changes, nil
}

// compareEvents orders events by time, then by place.
func compareEvents(a, b Event) int {
	if c := a.At.Compare(b.At); c != 0 {
		return c
	}
	return a.Place.compare(b.Place)
}
