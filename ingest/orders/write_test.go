package orders

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// TestAppendHistory_AsSQLite checks the compacted history the processor
// writes is the text SQLite's JSON functions make of the same events:
// every byte alone in each text field, then random strings of every byte.
func TestAppendHistory_AsSQLite(t *testing.T) {
	s, err := outbox.Open(context.Background(), outbox.DefaultConfig(filepath.Join(t.TempDir(), "j.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Date(2026, 5, 1, 9, 0, 0, 123, time.UTC)
	var texts []string
	for c := range 256 {
		texts = append(texts, "a"+string([]byte{byte(c)})+"z")
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for range 200 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		texts = append(texts, string(b))
	}
	const query = `SELECT json_group_array(json_array(column1, column2, column3, column4, column5, column6))
FROM (VALUES (?, ?, ?, ?, ?, ?), (?, ?, ?, ?, ?, ?))`
	for i, text := range texts {
		events := []Event{
			{Type: text, At: at, Place: Place{Topic: text, Partition: int32(i), Epoch: text, Offset: int64(i) << 33}},
			{Type: "paid", At: at.Add(time.Minute), Place: Place{Topic: "t", Partition: -1, Epoch: text + "x", Offset: -5}},
		}
		var args []any
		for _, e := range events {
			args = append(args, e.Place.Topic, e.Place.Partition, e.Place.Epoch, e.Place.Offset, e.Type, formatAt(e.At))
		}
		var want string
		if err := outboxtest.Get(context.Background(), s, &want, query, args...); err != nil {
			t.Fatal(err)
		}
		if got := string(appendHistory(nil, events)); got != want {
			t.Fatalf("text %q: history %q, SQLite %q", text, got, want)
		}
	}
}
