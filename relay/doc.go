// Package relay publishes the outbox to Kafka, in outbox id order, with a
// sarama producer.
//
// # Exactly-once (ModeExactlyOnce, the default)
//
// A read_committed consumer sees every outbox row exactly once, across any
// crash of the relay or the broker. The relay holds to it this way:
//
//  1. Its transactional id is stable for the database ("outboxd-" plus the
//     store's relay_id unless configured). Making the producer
//     (InitProducerID) bumps the id's epoch: an older producer with the
//     same id is fenced, and the transaction it left open is aborted (or,
//     if its commit had begun, completed) before the call returns. A
//     producer is made only while the store still owns the database
//     (Store.CheckOwner), so a process that lost the claim never fences
//     the one that won it.
//  2. It reads its last committed progress record from the compacted
//     progress topic (key = relay id): from the end of the partition back,
//     with read_uncommitted, each of its records taken once its commit
//     marker follows (step 1 ended every transaction of its id), so it
//     neither reads the whole partition nor waits for another relay's open
//     transaction. It resumes after the larger of that progress and
//     SQLite's.
//     CheckDatabase, run before the claim, refuses a database that never
//     published where the progress topic shows an earlier database at the
//     same path on the same host (ErrNewDatabase).
//  3. If Kafka's progress names an id above any the database ever assigned,
//     or a row the database holds differently, the database has gone back
//     in time: the relay refuses to publish (ErrBackInTime, state
//     "refusing") rather than skip rows or reuse ids.
//  4. Each batch (up to Config.Batch rows, or what arrived within
//     Config.Wait) is one Kafka transaction: the rows, then one progress
//     record naming the last row (id, feed, partition, epoch, position, n).
//     Rows and progress commit together or not at all.
//  5. After the commit the progress is stored in SQLite (at most every
//     100 ms, off the publishing path: Kafka already has it).
//  6. A batch a leader refuses as moving or busy, or leaderless, or
//     unanswered, is sent again with its sequence until
//     Config.DeliveryTimeout; a busy or moving coordinator is asked again
//     as long. Any other failure ends the session: the producer is dropped
//     and the relay starts again at step 1 after a capped exponential
//     backoff. While a produce is unanswered the transaction is never ended
//     with the producer's epoch: step 1's InitProducerID ends it. (A
//     broker refusing records as too large does not: a new producer
//     fences the refused transaction and the batch goes on in halves, see
//     "Both modes".) A commit
//     whose outcome is unknown is never guessed; the next session's
//     producer settles it and step 2 reads what happened. PRODUCER_FENCED
//     stops the relay (ErrFenced) when the store no longer owns the
//     database (another process claimed it) or never claimed it; while the
//     store still owns it, the relay starts over with a new producer.
//
// # At-least-once (ModeAtLeastOnce)
//
// An idempotent producer publishes each batch; the batch is marked
// published in SQLite after every record is acked. A failure or crash
// before the mark publishes the batch again. Every record carries the
// outboxd-id header, so consumers drop repeats.
//
// # Both modes
//
// Records carry the row's own headers and then outboxd-id, outboxd-feed,
// outboxd-epoch and outboxd-position, each outboxd-* name once (a row's own
// place headers are kept as outboxd-orig-*). No row stops the others: one
// whose record is over Config.MaxMessageBytes, or that a broker refuses as
// too large (the batch is published in halves until it stands alone), is
// stored as a dead letter of its feed (outbox.ReasonOutputTooLarge; a
// record a broker refuses for its timestamp likewise,
// ReasonOutputInvalidTimestamp), once
// per row and durably before any transaction that passes it commits, and
// is not published. Keys are partitioned as the Java
// client does (murmur2), so a key's rows stay in one partition, in id
// order; a row without a key goes to a random partition. Missing output
// topics are created unless Config.CreateTopics is false. The relay is
// woken by Store.Committed and polls every Config.PollInterval as a
// fallback; it reads rows in bounded batches (one being published, one
// read ahead), so memory stays flat however long the backlog. Published
// rows are pruned in bulk after Config.Retention.
//
// # Kafka clients
//
// The relay speaks to Kafka with sarama only: both modes send record
// batches themselves with sarama's request types (txnProducer), the
// exactly-once relay in transactions it drives, the at-least-once relay
// as an idempotent producer without one, and its reads (topic metadata and creation, ACL probes,
// the progress topic) go through internal/kafka, whose raw fetches report
// the offset after aborted batches and transaction markers: "read to the
// end" then stops exactly at the end.
//
// # Stopping
//
// Stopping has two steps, carried as one value (stopping, made once per
// Run) by what publishes, records and closes producers. Run's context is
// the soft step: once it is done no new session, batch or transaction
// begins. The hard step, done Config.ShutdownTimeout later, bounds the
// work in hand: the transaction (or the acks) of the batch being
// published, which may still commit until then, its progress write, the
// recorder's last write, and the wait for a closing producer. What only
// begins work takes the soft context, what finishes it the hard one.
// Opening a producer and
// running a transaction (calls to Kafka that take no context) run in a
// goroutine that is not abandoned: when their context is done, the
// connections they wait on are cut (internal/kafka's Dialer, under every
// producer and client) and they are waited for, so nothing they would
// still send reaches a broker after they return. A transaction cut so is
// left to the next producer's initialisation, which aborts it. Closing a
// producer is the exception: after a failure it finishes in the
// background (see dropProducer).
package relay
