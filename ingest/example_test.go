package ingest_test

import (
	"context"
	"log"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/outbox"
)

// Counter counts lines per distinct value and emits each new count.
type Counter struct{}

// Setup creates the processor's table; it runs once when the loop starts.
func (Counter) Setup(ctx context.Context, tx *outbox.Tx) error {
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS word_counts (word TEXT PRIMARY KEY, n INTEGER NOT NULL)`)
	return err
}

// Apply runs inside the batch's transaction: its writes, its outputs and the
// feed's position commit together, so each line counts exactly once.
func (Counter) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	if len(item.Value) == 0 {
		return ingest.Malformed("empty line") // a dead letter, not a retry
	}
	var n int64
	err := tx.Get(ctx, &n, `INSERT INTO word_counts (word, n) VALUES (?, 1)
		ON CONFLICT(word) DO UPDATE SET n = n + 1 RETURNING n`, string(item.Value))
	if err != nil {
		return err // transient: retried with backoff
	}
	return tx.Emit(ctx, outbox.Output{Topic: "words.counts", Key: item.Value, Value: strconv.AppendInt(nil, n, 10)})
}

// A processor of your own, run over a tailed file with outboxd's packages.
func Example_processor() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	store, err := outbox.Open(ctx, outbox.DefaultConfig("./data/words.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	feed := filefeed.New("./words.txt", filefeed.Options{})
	loop, err := ingest.NewLoop(store, feed, Counter{}, ingest.DefaultConfig("words"))
	if err != nil {
		log.Fatal(err)
	}
	if err := loop.Run(ctx); err != nil { // until SIGINT; commits the batch in hand
		log.Fatal(err)
	}
}
