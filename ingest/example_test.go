package ingest_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

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

// A processor of your own, run over a tailed file with outboxd's packages:
// the loop applies each line once, in the transaction that stores the
// feed's position, and its outputs wait in the outbox for the relay.
func Example_processor() {
	dir, err := os.MkdirTemp("", "words")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	words := filepath.Join(dir, "words.txt")
	if err := os.WriteFile(words, []byte("apple\nbanana\napple\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background()) // a server stops at SIGINT
	store, err := outbox.Open(ctx, outbox.DefaultConfig(filepath.Join(dir, "words.db")))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	cfg := ingest.DefaultConfig("words")
	cfg.Logger = slog.New(slog.DiscardHandler)
	feed := filefeed.New(words, filefeed.Options{Logger: cfg.Logger})
	loop, err := ingest.NewLoop(store, feed, Counter{}, cfg)
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx) }() // until ctx ends; commits the batch in hand
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if state, _ := loop.State(); state == outbox.StateCaughtUp {
			break
		}
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	rows, err := store.Rows(context.Background(), 0, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rows {
		fmt.Printf("%s %s=%s (line ending at %d)\n", r.Topic, r.Key, r.Value, r.Position)
	}
	// Output:
	// words.counts apple=1 (line ending at 6)
	// words.counts banana=1 (line ending at 13)
	// words.counts apple=2 (line ending at 19)
}
