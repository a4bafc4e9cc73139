package relay

import (
	"errors"
	"fmt"
)

// ErrFenced is returned by Run (wrapped) when another producer took over the
// relay's transactional id: a second relay on the same database, or, after
// a transaction outlived TransactionTimeout, the coordinator itself. The
// relay stops rather than fence the newcomer back; restart it once the
// other one is gone.
var ErrFenced = errors.New("fenced: another producer uses this transactional id")

// ErrBackInTime is returned by Run (wrapped) when the progress stored in
// Kafka names rows the database does not have: the database was restored
// from an older copy. Publishing would either skip rows or publish other
// rows under ids already used, so the relay refuses; an operator must
// decide.
var ErrBackInTime = errors.New("the database has gone back in time")

// MissingTopicError says an output topic does not exist and the relay may
// not create it (Config.CreateTopics is false).
type MissingTopicError struct {
	Topic string // the first missing topic
}

// Error names the topic and why the relay stops there.
func (e *MissingTopicError) Error() string {
	return fmt.Sprintf("topic %q does not exist and creating topics is disabled", e.Topic)
}

// ambiguousError marks an error after which the outcome of a transaction is
// unknown (a commit that failed or timed out).
type ambiguousError struct{ err error }

func (e *ambiguousError) Error() string { return "outcome unknown: " + e.err.Error() }
func (e *ambiguousError) Unwrap() error { return e.err }

// errAbandoned is returned when the shutdown deadline passed while a
// transaction was in hand; the next start aborts it.
var errAbandoned = errors.New("shutdown deadline passed with a transaction in hand; the next start aborts it")

// errBadRow marks a row that cannot be turned into a record (corrupt
// headers). It is never skipped: the relay stops there and reports it.
var errBadRow = errors.New("bad outbox row")

// errStore marks a failure of the outbox store (SQLite), not of Kafka.
var errStore = errors.New("outbox store")
