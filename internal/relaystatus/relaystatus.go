// Package relaystatus holds the relay's status snapshot, which the relay
// fills and the HTTP API reports: one struct, so neither copies the other
// and neither imports the other.
package relaystatus

import "time"

// Status is a snapshot of the relay, for the API and tests. Its state and
// mode are this package's words (State, Mode), which the relay sets and
// the API reports.
type Status struct {
	// Mode is ModeExactlyOnce or ModeAtLeastOnce.
	Mode Mode `json:"mode"`
	// RelayID keys the relay's progress (in SQLite and in Kafka); it is the
	// store's "relay_id". Empty until Run has read it.
	RelayID string `json:"relayId"`
	// TransactionalID is the exactly-once producer's transactional id.
	TransactionalID string `json:"transactionalId,omitempty"`
	// State is one of the State* constants but StateOff.
	State State `json:"state"`
	// Connected is true while a producer is open and its last operation
	// succeeded.
	Connected bool `json:"connected"`
	// LastPublishedID is the last outbox id known published: committed in
	// Kafka (exactly-once) or acked (at-least-once).
	LastPublishedID int64 `json:"lastPublishedId"`
	// PublishedTotal counts the rows this Run published as records.
	PublishedTotal int64 `json:"publishedTotal"`
	// Transactions counts the batches this Run committed.
	Transactions int64 `json:"transactions"`
	// DeadLettered counts the rows this Run stored as dead letters instead
	// of publishing them (outbox.ReasonOutputTooLarge); each is also in its
	// feed's dead-lettered count.
	DeadLettered int64 `json:"deadLettered"`
	// Pending is how many rows wait to be published, and OldestPendingAge
	// how long the oldest of them has waited. The count is refreshed about
	// once a second while Run runs; the age grows between refreshes.
	Pending          int64         `json:"pending"`
	OldestPendingAge time.Duration `json:"oldestPendingAgeNs"`
	// Pruned counts the rows this Run deleted from the outbox.
	Pruned int64 `json:"pruned"`
	// LastError is the last failure, with its time; it is cleared when a
	// producer is ready again or a batch is published.
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// Fenced is true once another producer took over the transactional id.
	Fenced bool `json:"fenced"`
	// Errors counts the relay's failures by relay.Class (its String) since it
	// was made, across Runs; every class is present from the start.
	Errors map[string]int64 `json:"errors"`
}
