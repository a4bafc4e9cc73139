package relay

import (
	"time"

	"github.com/IBM/sarama"

	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// saramaConfig is the relay's producer configuration: idempotent,
// acks=all, keys partitioned like the Java client, LZ4. The txnProducer
// reads its settings (batch limit, compression, acks, timeouts, retries,
// partitioner) and sends its requests itself, up to maxInFlight on a
// connection (see clientConfig), in both modes; a non-empty txnID makes
// it transactional (exactly-once).
func saramaConfig(c Config, txnID string) *sarama.Config {
	sc := kafkaclient.Config("outboxd-relay", c.Kafka) // version, TLS, SASL
	sc.ChannelBufferSize = 1024
	sc.Net.MaxOpenRequests = 1
	sc.Net.ReadTimeout = c.RequestTimeout
	// Topics are created on purpose (kafka.ensureTopics), never by a
	// metadata request.
	sc.Metadata.AllowAutoTopicCreation = false
	sc.Metadata.Full = false
	// Sarama's retries nest (a transaction request retries, each retry
	// looks up the coordinator with its own retries): keep each level
	// short so a failure surfaces within about a second. The relay's own
	// loop retries after that.
	sc.Metadata.Retry.Max = 1
	sc.Metadata.Retry.Backoff = 50 * time.Millisecond
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner
	// The idempotent producer has no commit: it waits for each success.
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	// The at-least-once producer's resends fill about the delivery
	// timeout, as the exactly-once producer's do (see
	// txnProducer.produce): a failover takes seconds.
	sc.Producer.Retry.Backoff = 100 * time.Millisecond
	sc.Producer.Retry.Max = resendsWithin(c.DeliveryTimeout, sc.Producer.Retry.Backoff)
	sc.Producer.Retry.BackoffFunc = func(retries, _ int) time.Duration {
		return resendBackoff(retries, sc.Producer.Retry.Backoff)
	}
	// The broker answers a produce within this (acks from the
	// replicas or REQUEST_TIMED_OUT), before the relay stops waiting.
	sc.Producer.Timeout = c.RequestTimeout * 2 / 3
	// Each partition's batch is bounded by this, counting each record
	// at most outbox.RecordBytes: the batch a broker measures is then
	// within c.MaxMessageBytes (see fits).
	sc.Producer.MaxMessageBytes = c.MaxMessageBytes - outbox.RecordBatchOverhead
	// LZ4: the cheapest codec to encode, and the one that saves the most
	// work where most of it is, in moving and storing the bytes (figures:
	// docs/performance.md). Every broker since 0.10 takes it, and consumers
	// decompress without being told. Records are still measured against
	// MaxMessageBytes uncompressed (see fits), so a batch that fits
	// uncompressed fits compressed.
	sc.Producer.Compression = sarama.CompressionLZ4
	if txnID != "" {
		sc.Producer.Transaction.ID = txnID
		sc.Producer.Transaction.Timeout = c.TransactionTimeout
		sc.Producer.Transaction.Retry.Max = 5
		sc.Producer.Transaction.Retry.Backoff = 50 * time.Millisecond
	}
	return sc
}

// resendBackoff is the wait before the retries'th resend of a batch: from
// base, doubling, up to produceMaxBackoff.
func resendBackoff(retries int, base time.Duration) time.Duration {
	wait := base
	for range retries {
		if wait >= produceMaxBackoff {
			return produceMaxBackoff
		}
		wait *= 2
	}
	return min(wait, produceMaxBackoff)
}

// resendsWithin is the number of resends whose backoffs (resendBackoff)
// add up to d, at least one.
func resendsWithin(d, base time.Duration) int {
	n := 0
	for total := time.Duration(0); total < d && n < 10_000; n++ {
		total += resendBackoff(n, base)
	}
	return max(n, 1)
}
