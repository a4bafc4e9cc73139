package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

func TestClassify(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("publish outbox rows 1..2: produce: %w", err) }
	cases := []struct {
		name string
		err  error
		want Class
	}{
		{"producer fenced", wrap(sarama.ErrProducerFenced), Fenced},
		{"fenced, wrapped twice", wrap(wrap(sarama.ErrProducerFenced)), Fenced},
		{"coordinator fenced", sarama.ErrTransactionCoordinatorFenced, Fenced},
		{"abort says fenced after a produce error", errors.Join(wrap(sarama.ErrInvalidProducerEpoch),
			fmt.Errorf("abort transaction: %w", sarama.ErrProducerFenced)), Fenced},
		{"our sentinel", fmt.Errorf("x: %w", ErrFenced), Fenced},
		{"invalid epoch alone", wrap(sarama.ErrInvalidProducerEpoch), Ambiguous},
		{"sequence error after reconnect", wrap(sarama.ErrOutOfOrderSequenceNumber), Ambiguous},
		{"unknown producer id", wrap(sarama.ErrUnknownProducerID), Ambiguous},
		{"failed commit", &ambiguousError{sarama.ErrOutOfBrokers}, Ambiguous},
		{"transaction manager state", sarama.ErrTransactionNotReady, Ambiguous},
		{"unknown error", errors.New("something else"), Ambiguous},
		{"out of brokers", wrap(sarama.ErrOutOfBrokers), Retryable},
		{"not leader", wrap(sarama.ErrNotLeaderForPartition), Retryable},
		{"concurrent transactions", sarama.ErrConcurrentTransactions, Retryable},
		{"coordinator loading", sarama.ErrOffsetsLoadInProgress, Retryable},
		{"connection refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, Retryable},
		{"eof", wrap(io.EOF), Retryable},
		{"deadline", context.DeadlineExceeded, Retryable},
		// A row too large is dead-lettered; one that surfaces means a
		// producer that could not be readied after it: start over.
		{"record too large", wrap(sarama.ErrMessageSizeTooLarge), Retryable},
		{"batch too large", wrap(sarama.ErrMessageSetSizeTooLarge), Retryable},
		{"over the producer's limit", wrap(sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 9 > 8")), Retryable},
		{"config error", wrap(sarama.ConfigurationError("too big")), Fatal},
		{"topic authorization", wrap(sarama.ErrTopicAuthorizationFailed), Unauthorized},
		{"txn id authorization", sarama.ErrTransactionalIDAuthorizationFailed, Unauthorized},
		{"group authorization", wrap(sarama.ErrGroupAuthorizationFailed), Unauthorized},
		{"cluster authorization", sarama.ErrClusterAuthorizationFailed, Unauthorized},
		{"wrong password", wrap(sarama.ErrSASLAuthenticationFailed), Unauthorized},
		{"wrong password, bare", sarama.ErrSASLAuthenticationFailed, Unauthorized},
		{"credentials refused at the check", fmt.Errorf("x: %w", &kafkasec.AuthError{Step: "sasl", Reason: "r"}), Unauthorized},
		{"explained refusal", &AuthorizationError{Operation: "Write", Resource: ResourceTopic, Name: "t", Err: sarama.ErrTopicAuthorizationFailed}, Unauthorized},
		// A refusal outranks the abort that followed it, as fencing does not.
		{"refused, then aborted", errors.Join(wrap(sarama.ErrTopicAuthorizationFailed), sarama.ErrOutOfBrokers), Unauthorized},
		{"missing topic", &MissingTopicError{Topic: "t"}, Fatal},
		{"back in time", fmt.Errorf("%w: row 9", ErrBackInTime), Fatal},
		{"bad row", fmt.Errorf("outbox row 3: %w: x", errBadRow), Fatal},
		{"store", fmt.Errorf("%w: database is locked", errStore), Retryable},
	}
	for _, c := range cases {
		if got := Classify(c.err); got != c.want {
			t.Errorf("%s: Classify(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// denied names what the request asked for the kind of resource refused.
func TestDenied(t *testing.T) {
	asks := []kafkasec.Ask{ask("Write", ResourceTransactionalID, "tx"), ask("IdempotentWrite", ResourceCluster, clusterName)}
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("init: %w", sarama.ErrTransactionalIDAuthorizationFailed),
			`not authorized: User:u lacks Write on transactional id "tx" (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)`},
		{sarama.ErrClusterAuthorizationFailed,
			`not authorized: User:u lacks IdempotentWrite on cluster "kafka-cluster" (CLUSTER_AUTHORIZATION_FAILED)`},
		{sarama.ErrGroupAuthorizationFailed,
			`not authorized: User:u lacks an operation on group "" (GROUP_AUTHORIZATION_FAILED)`},
		{io.EOF, "EOF"},
		{sarama.ErrNotLeaderForPartition, sarama.ErrNotLeaderForPartition.Error()},
	}
	for _, c := range cases {
		got := denied(c.err, "User:u", asks...)
		if got.Error() != c.want {
			t.Errorf("denied(%v) = %q, want %q", c.err, got, c.want)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("denied(%v) does not wrap it", c.err)
		}
	}
	if got := (&AuthorizationError{Operation: "Write", Resource: ResourceTopic, Candidates: []string{"a", "b"},
		Err: sarama.ErrTopicAuthorizationFailed}).Error(); got !=
		`not authorized: this client's principal lacks Write on one of the topics ["a" "b"] (TOPIC_AUTHORIZATION_FAILED)` {
		t.Errorf("with candidates: %q", got)
	}
}

func TestConfig_Validate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	c := DefaultConfig()
	c.Brokers = nil
	c.Mode = "sometimes"
	c.Batch = 0
	c.Wait = -1
	c.TopicPartitions = 0
	c.MaxBackoff = 0
	c.MaxMessageBytes = 100
	err := c.Validate()
	for _, field := range []string{"brokers", "mode", "batch", "wait", "topic partitions", "max backoff", "max message bytes"} {
		if err == nil || !strings.Contains(err.Error(), field+":") {
			t.Errorf("Validate() = %v, want an error about %s", err, field)
		}
	}
	alo := DefaultConfig()
	alo.Mode, alo.ProgressTopic = ModeAtLeastOnce, ""
	if err := alo.Validate(); err != nil {
		t.Errorf("at-least-once needs no progress topic: %v", err)
	}
}
