package orders

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

var allStatuses = []Status{None, Placed, Paid, Shipped, Delivered, Cancelled}

var allTypes = []string{"placed", "paid", "shipped", "delivered", "cancelled"}

func TestNext(t *testing.T) {
	legal := map[Status][]string{
		None:    {"placed"},
		Placed:  {"paid", "cancelled"},
		Paid:    {"shipped", "cancelled"},
		Shipped: {"delivered"},
	}
	for _, from := range allStatuses {
		for _, typ := range allTypes {
			t.Run(fmt.Sprintf("%s/%s", describe(from), typ), func(t *testing.T) {
				got, err := Next(from, typ)
				if slices.Contains(legal[from], typ) {
					if err != nil || got != Status(typ) {
						t.Fatalf("Next(%q, %q) = %q, %v; want %q", from, typ, got, err, typ)
					}
					return
				}
				if !errors.Is(err, ErrInvalidTransition) || got != from {
					t.Fatalf("Next(%q, %q) = %q, %v; want %q and ErrInvalidTransition", from, typ, got, err, from)
				}
			})
		}
	}
	if _, err := Next(Placed, "refunded"); !errors.Is(err, ErrInvalidTransition) {
		t.Errorf("unknown type: %v", err)
	}
}

// ev makes an event of order o at minute m, read at offset off.
func ev(typ string, m int, off int64) Event {
	return Event{OrderID: "o", Type: typ, At: time.Date(2026, 1, 1, 0, m, 0, 0, time.UTC),
		Place: Place{Topic: "orders.events", Epoch: "id:0", Offset: off}}
}

func TestFold(t *testing.T) {
	type change struct {
		status, previous Status
		minute           int
	}
	cases := []struct {
		name    string
		history []Event
		e       Event
		status  Status
		changes []change
		invalid bool
	}{
		{"First", nil, ev("placed", 1, 0), Placed, []change{{Placed, None, 1}}, false},
		{"InOrder", []Event{ev("placed", 1, 0), ev("paid", 2, 1)}, ev("shipped", 3, 2), Shipped,
			[]change{{Shipped, Paid, 3}}, false},
		{"Cancel", []Event{ev("placed", 1, 0), ev("paid", 2, 1)}, ev("cancelled", 3, 2), Cancelled,
			[]change{{Cancelled, Paid, 3}}, false},
		{"EarlierArrivesLate", []Event{ev("placed", 1, 0), ev("cancelled", 3, 1)}, ev("paid", 2, 2), Cancelled,
			[]change{{Paid, Placed, 2}, {Cancelled, Paid, 3}}, false},
		{"FirstArrivesLast", []Event{}, ev("placed", 1, 9), Placed, []change{{Placed, None, 1}}, false},
		{"LaterBeforeEarlier", nil, ev("paid", 2, 0), None, nil, true},
		{"SkipsAStep", []Event{ev("placed", 1, 0)}, ev("shipped", 3, 1), None, nil, true},
		{"AfterCancel", []Event{ev("placed", 1, 0), ev("cancelled", 2, 1)}, ev("paid", 3, 2), None, nil, true},
		{"TwiceTheSame", []Event{ev("placed", 1, 0), ev("paid", 2, 1)}, ev("paid", 4, 2), None, nil, true},
		{"OlderBreaksHistory", []Event{ev("placed", 1, 0), ev("paid", 3, 1)}, ev("cancelled", 2, 2), None, nil, true},
		{"SameTimeByOffset", []Event{ev("placed", 1, 5)}, ev("paid", 1, 6), Paid, []change{{Paid, Placed, 1}}, false},
		{"SameTimeWrongOffset", []Event{ev("placed", 1, 5)}, ev("paid", 1, 4), None, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, changes, err := Fold(c.history, c.e)
			if c.invalid {
				if !errors.Is(err, ErrInvalidTransition) {
					t.Fatalf("Fold = %q, %v, %v; want ErrInvalidTransition", status, changes, err)
				}
				return
			}
			if err != nil || status != c.status || len(changes) != len(c.changes) {
				t.Fatalf("Fold = %q, %+v, %v; want %q, %+v", status, changes, err, c.status, c.changes)
			}
			for i, w := range c.changes {
				g := changes[i]
				if g.Status != w.status || g.Previous != w.previous || g.At.Minute() != w.minute {
					t.Errorf("change %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// TestFold_OutOfOrder folds a whole history in every order of arrival,
// refusing and retrying as the processor does, and checks the result does
// not depend on the order.
func TestFold_OutOfOrder(t *testing.T) {
	histories := [][]Event{
		{ev("placed", 1, 0), ev("paid", 2, 1), ev("shipped", 3, 2), ev("delivered", 4, 3)},
		{ev("placed", 1, 0), ev("paid", 2, 1), ev("cancelled", 3, 2)},
	}
	for _, h := range histories {
		final := Status(h[len(h)-1].Type)
		for _, perm := range permutations(h) {
			var applied []Event
			pending := perm
			for round := 0; len(pending) > 0; round++ {
				if round > len(h) {
					t.Fatalf("arrival %v: %d events never applied", types(perm), len(pending))
				}
				var again []Event
				for _, e := range pending {
					if _, _, err := Fold(applied, e); err != nil {
						again = append(again, e) // retried later
						continue
					}
					applied = append(applied, e)
				}
				pending = again
			}
			status, _, err := Fold(applied[:len(applied)-1], applied[len(applied)-1])
			if err != nil || status != final {
				t.Errorf("arrival %v: status %q, %v; want %q", types(perm), status, err, final)
			}
		}
	}
}

func permutations(es []Event) [][]Event {
	if len(es) <= 1 {
		return [][]Event{slices.Clone(es)}
	}
	var out [][]Event
	for i := range es {
		rest := append(slices.Clone(es[:i]), es[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]Event{es[i]}, p...))
		}
	}
	return out
}

func types(es []Event) []string {
	ts := make([]string, len(es))
	for i, e := range es {
		ts[i] = e.Type
	}
	return ts
}
