package outbox_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

func TestStore_DeadLetterRows(t *testing.T) {
	ctx := context.Background()
	s, clk := openStore(t)
	must(t, s.RegisterFeed(ctx, outbox.FeedInfo{Name: "f"}))
	hs := outbox.EncodeHeaders([]outbox.Header{{Key: "trace", Value: []byte("t1")}})
	big := bytes.Repeat([]byte{0xff, 'x'}, 3<<20)
	rows := []outbox.Row{
		{ID: 7, Feed: "f", Partition: 2, Epoch: "e1", Position: 41, N: 1, Topic: "f.out", Key: []byte("k"), Value: big, Headers: hs},
		// A feed the store has no row for yet, and a null key and value.
		{ID: 9, Feed: "g", Epoch: "e2", Position: 3, Topic: "g.out"},
	}
	dls := []outbox.RowDeadLetter{
		{Row: rows[0], Reason: outbox.ReasonOutputTooLarge, Error: "6 MiB"},
		{Row: rows[1], Reason: outbox.ReasonOutputTooLarge, Error: "refused"},
	}

	t.Run("OK", func(t *testing.T) {
		n, err := s.DeadLetterRows(ctx, dls)
		must(t, err)
		equal(t, "added", n, 2)
		got, err := s.DeadLetters(ctx, "f", 0, 10)
		must(t, err)
		if len(got) != 1 {
			t.Fatalf("%d dead letters of f, want 1", len(got))
		}
		d := got[0]
		if d.ID != 1 || d.Feed != "f" || d.Partition != 2 || d.Epoch != "e1" || d.Position != 41 || d.Attempts != 1 ||
			d.Reason != outbox.ReasonOutputTooLarge || d.Error != "6 MiB" || string(d.Key) != "k" ||
			!bytes.Equal(d.Headers, hs) || d.At != clk.Now().UnixNano() || d.OutboxID == nil || *d.OutboxID != 7 ||
			d.Topic != "f.out" || d.RequeuedAt != 0 {
			t.Fatalf("dead letter %d: %s %d %s %d, %d attempts, %q %q, key %q, outbox id %v, topic %q: want row 7 of f whole",
				d.ID, d.Feed, d.Partition, d.Epoch, d.Position, d.Attempts, d.Reason, d.Error, d.Key, d.OutboxID, d.Topic)
		}
		if !bytes.Equal(d.Payload, big) {
			t.Fatalf("payload of %d bytes, want the row's value of %d", len(d.Payload), len(big))
		}
		g, err := s.DeadLetters(ctx, "g", 0, 10)
		must(t, err)
		if len(g) != 1 || g[0].Key != nil || g[0].Payload != nil || *g[0].OutboxID != 9 || g[0].Topic != "g.out" {
			t.Fatalf("dead letters of g = %+v, want row 9 with a null key and payload", g)
		}
		for feed, want := range map[string]int64{"f": 1, "g": 1} {
			fs, err := s.Feed(ctx, feed)
			must(t, err)
			equal(t, feed+" dead-lettered", fs.DeadLettered, want)
		}
	})

	t.Run("AgainChangesNothing", func(t *testing.T) {
		n, err := s.DeadLetterRows(ctx, append(dls[:1:1], outbox.RowDeadLetter{Row: outbox.Row{ID: 8, Feed: "f", Topic: "t"},
			Reason: outbox.ReasonOutputTooLarge, Error: "new"}))
		must(t, err)
		equal(t, "added", n, 1)
		got, err := s.DeadLetters(ctx, "f", 0, 10)
		must(t, err)
		if len(got) != 2 || *got[0].OutboxID != 7 || got[0].Error != "6 MiB" || *got[1].OutboxID != 8 {
			t.Fatalf("dead letters of f = %+v, want rows 7 (as first stored) and 8", got)
		}
		fs, err := s.Feed(ctx, "f")
		must(t, err)
		equal(t, "dead-lettered", fs.DeadLettered, 2)
	})

	t.Run("ItemDeadLettersHaveNoRow", func(t *testing.T) {
		id := deadLetter(t, s, outbox.DeadLetter{Feed: "f", Epoch: "e", Reason: "r", Error: "e"})
		d, err := s.DeadLetterByID(ctx, "f", id)
		must(t, err)
		if d.OutboxID != nil || d.Topic != "" {
			t.Fatalf("an item's dead letter names outbox row %v, topic %q", d.OutboxID, d.Topic)
		}
	})
}

func TestPublishedBytes(t *testing.T) {
	p := outbox.Place{Feed: "ledger", Epoch: "65024:9979361:7d453c7ecb0cbfce", Position: 1234567}
	o := outbox.Output{Topic: "t", Key: []byte("key"), Value: bytes.Repeat([]byte("v"), 1000),
		Headers: []outbox.Header{{Key: "a", Value: []byte("b")}, {Key: outbox.HeaderID, Value: []byte("12")}}}
	own := outbox.RecordBytes(o.Key, o.Value, o.Headers)
	equal(t, "RecordBytes", own, 36+3+1000+(1+1+10)+(10+2+10))
	// The place headers with the longest id, and outboxd-id renamed
	// outboxd-orig-id.
	place := (10 + 19 + 10) + (12 + 6 + 10) + (13 + 30 + 10) + (16 + 7 + 10)
	equal(t, "PublishedBytes", outbox.PublishedBytes(p, o), own+5+place)
}
