package kafka

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/IBM/sarama"
)

// IsRetriable reports the Kafka codes the Java client treats as retriable
// (RetriableException): a leader, coordinator or replica that is moving
// or busy, a request that timed out. It is the one list the product's
// Kafka code consults; a caller that must not retry one of them for its
// own request says so where it calls (a fetch's CORRUPT_MESSAGE, which
// the same fetch answers again). Sarama has already retried them
// internally when they reach a producer's caller.
func IsRetriable(code sarama.KError) bool {
	switch code {
	case sarama.ErrInvalidMessage, sarama.ErrUnknownTopicOrPartition, sarama.ErrLeaderNotAvailable,
		sarama.ErrNotLeaderForPartition, sarama.ErrRequestTimedOut, sarama.ErrBrokerNotAvailable,
		sarama.ErrReplicaNotAvailable, sarama.ErrNetworkException, sarama.ErrOffsetsLoadInProgress,
		sarama.ErrConsumerCoordinatorNotAvailable, sarama.ErrNotCoordinatorForConsumer,
		sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrNotController,
		sarama.ErrConcurrentTransactions, sarama.ErrKafkaStorageError, sarama.ErrFencedLeaderEpoch,
		sarama.ErrUnknownLeaderEpoch, sarama.ErrOffsetNotAvailable, sarama.ErrPreferredLeaderNotAvailable,
		sarama.ErrEligibleLeadersNotAvailable, sarama.ErrThrottlingQuotaExceeded,
		sarama.ErrOperationNotAttempted, sarama.ErrReassignmentInProgress:
		return true
	}
	return false
}

// IsNetworkError reports a failure of the connection itself rather than
// an answer: refused, reset, closed, ended early, timed out, or a
// deadline (a net.Error covers *net.OpError and context.DeadlineExceeded).
func IsNetworkError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, context.DeadlineExceeded)
}

// isConnectionError reports a failure of the connection, or sarama's
// client finding none: another broker, or the same one later, may do
// better.
func isConnectionError(err error) bool {
	return IsNetworkError(err) || errors.Is(err, sarama.ErrNotConnected) || errors.Is(err, sarama.ErrOutOfBrokers)
}
