package relay

import (
	"errors"

	"github.com/IBM/sarama"

	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
)

// Class is what the relay does after a Kafka error.
type Class int

const (
	// Retryable errors are transient: the broker is unreachable, a leader
	// or coordinator is moving, a topic is still being created. Nothing
	// about the transaction in hand is unknown beyond what a new session
	// settles anyway; the relay backs off and starts again.
	Retryable Class = iota
	// Ambiguous errors leave the outcome of the transaction in hand
	// unknown, or the producer in a state it cannot be trusted in (a
	// sequence error after a reconnect, an unknown producer id). The relay
	// never guesses: it closes the producer, makes a new one (which fences
	// the old one and aborts or completes its transaction), re-reads the
	// progress and goes on from there.
	Ambiguous
	// Fenced means another producer took over the transactional id. The
	// relay stops, unless its store still owns the database: making a new
	// producer would fence the newcomer in turn.
	Fenced
	// Fatal errors will not go away without an operator: an unsupported
	// broker, a missing topic the relay may not create. The relay keeps
	// retrying at its longest backoff and reports the error; no row is
	// skipped. (A record too large is not one of them: the relay stores
	// its row as a dead letter and goes on, see publish.)
	Fatal
	// Unauthorized errors say Kafka refused the relay: its credentials (a
	// wrong password, a certificate refused on either side: kafkasec's
	// ErrRefused, SASL_AUTHENTICATION_FAILED) or an operation its ACLs do
	// not grant (TOPIC_, TRANSACTIONAL_ID_, GROUP_ or
	// CLUSTER_AUTHORIZATION_FAILED; an *AuthorizationError names the
	// operation and the resource). Only an operator can fix them; the
	// relay's state says unauthorized, it logs the refusal once and asks
	// again every Config.UnauthorizedBackoff, and goes on by itself once
	// allowed. No row is skipped.
	Unauthorized
)

// String names the class: "retryable", "ambiguous", "fenced", "fatal" or
// "unauthorized".
func (c Class) String() string {
	switch c {
	case Retryable:
		return "retryable"
	case Ambiguous:
		return "ambiguous"
	case Fenced:
		return "fenced"
	case Fatal:
		return "fatal"
	case Unauthorized:
		return "unauthorized"
	}
	return "unknown"
}

// Classify sorts an error from the producer, the admin and progress
// reader (all sarama: their Kafka codes are sarama.KError values), or the
// relay itself into a Class. An error it does not
// know is Ambiguous: when in doubt the relay starts over from the progress
// Kafka holds, which is always safe.
func Classify(err error) Class {
	switch {
	case err == nil:
		return Retryable
	case errors.Is(err, ErrFenced), isFenced(err):
		// Checked first: an abort's PRODUCER_FENCED outranks the produce
		// error that led to it.
		return Fenced
	case isUnauthorized(err):
		// Before the codes below: a refusal wrapped in a produce or
		// commit failure is still the operator's to fix.
		return Unauthorized
	case errors.Is(err, ErrBackInTime), errors.Is(err, errBadRow):
		return Fatal
	}
	if errors.Is(err, errStore) {
		// SQLite busy or failing: the same session logic applies, with
		// a backoff; nothing about Kafka is in doubt.
		return Retryable
	}
	if isRefusedRecord(err) {
		// The relay dead-letters a row too large (or refused for its
		// timestamp) itself; such an error
		// reaches here only when the producer could not be readied
		// after it. A new session publishes the batch again and finds
		// the row.
		return Retryable
	}
	var missing *MissingTopicError
	if errors.As(err, &missing) {
		return Fatal
	}
	var amb *ambiguousError
	if errors.As(err, &amb) {
		return Ambiguous
	}
	if c, ok := classifyKafka(err); ok {
		return c
	}
	if isNetworkError(err) {
		return Retryable
	}
	return Ambiguous
}

// isFenced reports a fencing error code anywhere in err's tree.
func isFenced(err error) bool {
	return errors.Is(err, sarama.ErrProducerFenced) || errors.Is(err, sarama.ErrTransactionCoordinatorFenced)
}

// classifyKafka classifies a Kafka error code found in err (a
// sarama.KError), or a sarama client-side error.
func classifyKafka(err error) (Class, bool) {
	var ke sarama.KError
	if errors.As(err, &ke) {
		return classifyCode(ke), true
	}
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) {
		// Raised before sending: the producer is misconfigured.
		return Fatal, true
	}
	switch {
	case errors.Is(err, sarama.ErrOutOfBrokers), errors.Is(err, sarama.ErrNotConnected),
		errors.Is(err, sarama.ErrClosedClient), errors.Is(err, sarama.ErrShuttingDown),
		errors.Is(err, sarama.ErrBrokerNotFound), errors.Is(err, sarama.ErrControllerNotAvailable):
		// The client lost its brokers or is closing: connect again.
		return Retryable, true
	case errors.Is(err, sarama.ErrTransactionNotReady), errors.Is(err, sarama.ErrTransitionNotAllowed),
		errors.Is(err, sarama.ErrTxnUnableToParseResponse), errors.Is(err, sarama.ErrAddPartitionsToTxn):
		// The transaction manager is in a state we did not ask for.
		return Ambiguous, true
	}
	return 0, false
}

// classifyCode classifies a Kafka protocol error code.
func classifyCode(code sarama.KError) Class {
	switch code {
	case sarama.ErrProducerFenced, sarama.ErrTransactionCoordinatorFenced:
		// PRODUCER_FENCED: the coordinator has a newer epoch for our
		// transactional id. TRANSACTION_COORDINATOR_FENCED: our view of the
		// coordinator is stale in the same way.
		return Fenced
	case sarama.ErrInvalidProducerEpoch:
		// On produce this may mean fenced, or only that the coordinator
		// aborted a timed-out transaction. The relay aborts, and the
		// coordinator's answer (PRODUCER_FENCED or not) decides.
		return Ambiguous
	case sarama.ErrOutOfOrderSequenceNumber, sarama.ErrDuplicateSequenceNumber,
		sarama.ErrUnknownProducerID, sarama.ErrInvalidProducerIDMapping, sarama.ErrInvalidTxnState,
		sarama.ErrUnknown:
		// The broker's view of our producer state and ours disagree (after
		// a reconnect, an expired producer id): start a new producer.
		return Ambiguous
	case sarama.ErrClusterAuthorizationFailed, sarama.ErrTopicAuthorizationFailed,
		sarama.ErrTransactionalIDAuthorizationFailed, sarama.ErrGroupAuthorizationFailed,
		sarama.ErrSASLAuthenticationFailed:
		// The principal may not do this, or is not who it says: an
		// operator grants the ACL or fixes the credentials.
		return Unauthorized
	case sarama.ErrUnsupportedVersion, sarama.ErrUnsupportedForMessageFormat,
		sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidRecord,
		sarama.ErrInvalidTopic, sarama.ErrInvalidRequiredAcks, sarama.ErrInvalidTransactionTimeout,
		sarama.ErrPolicyViolation, sarama.ErrInvalidReplicationFactor, sarama.ErrInvalidPartitions,
		sarama.ErrInvalidConfig, sarama.ErrInvalidRequest, sarama.ErrUnsupportedCompressionType:
		// Retrying the same request gets the same answer.
		return Fatal
	}
	if isRetriableCode(code) {
		return Retryable
	}
	return Ambiguous
}

// isRetriableCode is kafkaclient.IsRetriable, the product's one list of
// retriable codes: a leader, coordinator or replica that is moving or busy.
func isRetriableCode(code sarama.KError) bool { return kafkaclient.IsRetriable(code) }

// isNetworkError is kafkaclient.IsNetworkError: connection-level failures
// (refused, reset, closed, timed out, or a deadline).
func isNetworkError(err error) bool { return kafkaclient.IsNetworkError(err) }
