package relay

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkEnsureOutputTopics is the relay's check of a batch's topics
// when every one is known already (the usual case): 4,000 rows of one
// topic, as a batch of one feed has. ns/op is per row.
func BenchmarkEnsureOutputTopics(b *testing.B) {
	topic := "outboxd-bench-0123abcd.end_to_end"
	rows := make([]outbox.Row, 4000)
	for i := range rows {
		rows[i].Topic = topic
	}
	r := &Relay{known: map[string]bool{topic: true}}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += len(rows) {
		if err := r.ensureOutputTopics(context.Background(), rows); err != nil {
			b.Fatal(err)
		}
	}
}
