package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// fill returns n bytes drawn from a generator seeded with c: the same for
// the same c and n, and incompressible, so the producer's compression
// cannot bring a record a broker must refuse under the broker's limit.
func fill(c byte, n int) []byte {
	b := make([]byte, n)
	rng := rand.NewChaCha8([32]byte{c})
	_, _ = rng.Read(b)
	return b
}

// exactFit returns a value that makes the record of row (to be emitted as
// outbox row id of feed "f") exactly as large as limit allows: one byte
// more and it is over.
func exactFit(t *testing.T, r row, id int64, limit int) []byte {
	t.Helper()
	base, err := message(&outbox.Row{ID: id, Feed: "f", Epoch: "e1", Position: id, Topic: r.topic, Key: r.key, Value: []byte{}},
		[]byte("f"), []byte("e1"))
	if err != nil {
		t.Fatal(err)
	}
	return fill('=', limit-outbox.RecordBatchOverhead-base.size)
}

// published checks the records read from topic against the rows wanted
// (by id): in exactly-once mode each exactly once, in at-least-once mode
// each at least once and nothing else; whole, and in key order. In
// at-least-once mode the order is that of each row's last copy: a batch a
// broker refused is sent again in halves, in order, while records of it
// after the refused ones may have gone out the first time.
func published(t *testing.T, mode Mode, recs []*kgo.Record, want map[int64]row) {
	t.Helper()
	ids := make([]int64, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	if mode == ModeAtLeastOnce {
		recs = lastCopies(t, recs)
	}
	exactlyOnce(t, recs, ids)
	for _, r := range recs {
		id := idOf(t, r)
		if w, ok := want[id]; ok && (!bytes.Equal(r.Value, w.value) || !bytes.Equal(r.Key, w.key)) {
			t.Errorf("row %d: key %q and %d value bytes, want %q and %d", id, r.Key, len(r.Value), w.key, len(w.value))
		}
	}
	checkKeyOrder(t, recs)
}

// lastCopies keeps the last record of each outboxd-id, in order.
func lastCopies(t *testing.T, recs []*kgo.Record) []*kgo.Record {
	t.Helper()
	last := map[int64]int{}
	for i, r := range recs {
		last[idOf(t, r)] = i
	}
	var out []*kgo.Record
	for i, r := range recs {
		if last[idOf(t, r)] == i {
			out = append(out, r)
		}
	}
	return out
}

// deadLettered checks that feed f's dead letters are exactly the rows in
// want (by id), each once and whole, counted once in the feed's count, and
// that each error says why.
func deadLettered(t *testing.T, s *outbox.Store, want map[int64]row, why string) {
	t.Helper()
	deadLetteredAs(t, s, want, outbox.ReasonOutputTooLarge, why)
}

// deadLetteredAs is deadLettered with the reason each dead letter must
// give.
func deadLetteredAs(t *testing.T, s *outbox.Store, want map[int64]row, reason, why string) {
	t.Helper()
	ds, err := s.DeadLetters(context.Background(), "f", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]int{}
	for _, d := range ds {
		if d.OutboxID == nil {
			t.Errorf("dead letter %d names no outbox row", d.ID)
			continue
		}
		id := *d.OutboxID
		seen[id]++
		w, ok := want[id]
		switch {
		case !ok:
			t.Errorf("row %d dead-lettered, want only %d rows", id, len(want))
		case d.Reason != reason || !strings.Contains(d.Error, why) || d.Topic != w.topic ||
			!bytes.Equal(d.Key, w.key) || !bytes.Equal(d.Payload, w.value) || d.Position != id || d.Epoch != "e1":
			t.Errorf("dead letter of row %d: %s %q, topic %s, key %q, %d payload bytes, at %s %d; want %s (%s), %s, %q, %d bytes, e1 %d",
				id, d.Reason, d.Error, d.Topic, d.Key, len(d.Payload), d.Epoch, d.Position,
				reason, why, w.topic, w.key, len(w.value), id)
		}
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("row %d dead-lettered %d times, want once", id, seen[id])
		}
	}
	f, err := s.Feed(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	if f.DeadLettered != int64(len(want)) {
		t.Errorf("feed counts %d dead letters, want %d", f.DeadLettered, len(want))
	}
}

// split sorts emitted rows into those to publish and those too large.
func split(ids []int64, rows []row, big map[int]bool) (pub, dead map[int64]row) {
	pub, dead = map[int64]row{}, map[int64]row{}
	for i, id := range ids {
		if big[i] {
			dead[id] = rows[i]
		} else {
			pub[id] = rows[i]
		}
	}
	return pub, dead
}

// TestRelay_OutputTooLarge: rows over the relay's limit among normal rows
// become dead letters, once, and every other row is published as usual.
// The broker's limit is the relay's, so the row that fits exactly shows
// the relay counts a record as the broker does.
func TestRelay_OutputTooLarge(t *testing.T) {
	const limit = 64 << 10
	for _, mode := range []Mode{ModeExactlyOnce, ModeAtLeastOnce} {
		t.Run(string(mode), func(t *testing.T) {
			c := newCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(limit)}))
			brokers := c.ListenAddrs()
			s := outboxtest.TempStore(t)
			rows := keyed("t", 40, 4, 0)
			rows[5].value = fill('b', 2*limit) // far over
			rows[20].value = exactFit(t, rows[20], 21, limit)
			rows[21].value = append(exactFit(t, rows[21], 22, limit), '+') // one byte over
			rows[30].key = fill('k', limit)                                // over by its key
			ids := emit(t, s, "f", rows...)
			cfg := testConfig(t, brokers)
			cfg.Mode, cfg.MaxMessageBytes = mode, limit
			rr := startRelay(t, s, cfg)
			rr.waitPublished(t, ids[len(ids)-1])

			pub, dead := split(ids, rows, map[int]bool{5: true, 21: true, 30: true})
			published(t, mode, readCommitted(t, brokers, "t"), pub)
			deadLettered(t, s, dead, "over the relay's limit")
			st := rr.r.Status()
			if st.DeadLettered != 3 || st.PublishedTotal != int64(len(pub)) || st.LastError != "" {
				t.Errorf("status: %d dead-lettered, %d published, error %q; want 3, %d, none",
					st.DeadLettered, st.PublishedTotal, st.LastError, len(pub))
			}
		})
	}
}

// TestRelay_BrokerRefusesTooLarge: a topic's limit, or the broker's, is
// below the relay's, so the broker refuses records the relay let through.
// The relay finds them by halving the batch, makes them dead letters, and
// publishes the others.
func TestRelay_BrokerRefusesTooLarge(t *testing.T) {
	const brokerLimit = 32 << 10
	cases := []struct {
		name  string
		setup func(t *testing.T) *kfake.Cluster
	}{
		{"TopicLimit", func(t *testing.T) *kfake.Cluster {
			c := newCluster(t)
			if err := c.CreateTopic("t", 3, map[string]string{"max.message.bytes": strconv.Itoa(brokerLimit)}); err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"BrokerLimit", func(t *testing.T) *kfake.Cluster {
			return newCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(brokerLimit)}))
		}},
	}
	for _, tc := range cases {
		for _, mode := range []Mode{ModeExactlyOnce, ModeAtLeastOnce} {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				c := tc.setup(t)
				brokers := c.ListenAddrs()
				s := outboxtest.TempStore(t)
				rows := keyed("t", 60, 4, 0)
				rows[7].value = fill('x', 3*brokerLimit)
				rows[41].value = fill('y', brokerLimit)
				ids := emit(t, s, "f", rows...)
				cfg := testConfig(t, brokers)
				cfg.Mode = mode // the relay's limit is the default, 1 MiB
				rr := startRelay(t, s, cfg)
				rr.waitPublished(t, ids[len(ids)-1])

				pub, dead := split(ids, rows, map[int]bool{7: true, 41: true})
				published(t, mode, readCommitted(t, brokers, "t"), pub)
				deadLettered(t, s, dead, "refused")
				if st := rr.r.Status(); st.DeadLettered != 2 {
					t.Errorf("status counts %d dead letters, want 2", st.DeadLettered)
				}
			})
		}
	}
}

// TestRelay_TooLargeCommitLost: the transaction that passes a dead-lettered
// row is cut at its commit. The dead letter was in SQLite before the
// commit was asked for; the next session publishes the batch again, and the
// dead letter is neither lost nor stored or counted twice.
func TestRelay_TooLargeCommitLost(t *testing.T) {
	const limit = 16 << 10
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	cfg := testConfig(t, brokers)
	cfg.MaxMessageBytes = limit
	rr := startRelay(t, s, cfg)
	first := emit(t, s, "f", keyed("t", 10, 2, 0)...)
	rr.waitPublished(t, first[len(first)-1])

	var cut, storedAtCommit atomic.Int32
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if !req.(*kmsg.EndTxnRequest).Commit {
			return nil, nil, false
		}
		ds, err := s.DeadLetters(context.Background(), "f", 0, 10)
		if err == nil && len(ds) == 1 {
			storedAtCommit.Add(1)
		}
		if cut.Add(1) == 1 {
			c.KeepControl()
			return nil, errors.New("cut at the commit"), true // the connection dies, the commit unknown
		}
		c.DropControl()
		return nil, nil, false
	})
	rows := keyed("t", 20, 2, 10)
	rows[4].value = fill('z', 2*limit)
	ids := emit(t, s, "f", rows...)
	rr.waitPublished(t, ids[len(ids)-1])

	pub, dead := split(ids, rows, map[int]bool{4: true})
	for i, id := range first {
		pub[id] = keyed("t", 10, 2, 0)[i]
	}
	published(t, ModeExactlyOnce, readCommitted(t, brokers, "t"), pub)
	deadLettered(t, s, dead, "over the relay's limit")
	if cut.Load() < 2 || storedAtCommit.Load() < 2 {
		t.Errorf("%d commits asked for, %d with the dead letter stored: want both at least 2 (the cut one and its retry)",
			cut.Load(), storedAtCommit.Load())
	}
}

// TestRelay_TooLargeAcrossFailures publishes a backlog holding rows too
// large for the relay and rows too large for the topic while the broker's
// connections are cut at random moments and the relay is restarted: every
// other row is published exactly once, every large one is one dead letter.
func TestRelay_TooLargeAcrossFailures(t *testing.T) {
	const limit, topicLimit = 48 << 10, 24 << 10
	c, p := proxiedCluster(t)
	if err := c.CreateTopic("t", 3, map[string]string{"max.message.bytes": strconv.Itoa(topicLimit)}); err != nil {
		t.Fatal(err)
	}
	brokers := c.ListenAddrs()
	s := outboxtest.TempStore(t)
	rows := keyed("t", 1500, 7, 0)
	big := map[int]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 3; i < len(rows); i += 37 + rng.IntN(40) {
		big[i] = true
		rows[i].value = fill('r', topicLimit+rng.IntN(topicLimit)) // the broker refuses it
		if i%2 == 0 {
			rows[i].value = fill('l', limit+rng.IntN(limit)) // the relay does not send it
		}
	}
	ids := emit(t, s, "f", rows...)
	last := ids[len(ids)-1]
	cfg := testConfig(t, brokers)
	cfg.MaxMessageBytes, cfg.Batch = limit, 64

	for round := 0; ; round++ {
		rr := startRelay(t, s, cfg)
		if round == 4 {
			rr.waitPublished(t, last)
			break
		}
		// Cut the connections mid-transaction, then restart the relay
		// once it has published some more.
		cutWhilePublishing(t, rr, p, last)
		p.restore()
		before := rr.r.Status().LastPublishedID
		wait(t, 20*time.Second, func() error {
			if st := rr.r.Status(); st.LastPublishedID <= before && st.LastPublishedID < last {
				return fmt.Errorf("round %d: published through %d (state %s, %q)", round, st.LastPublishedID, st.State, st.LastError)
			}
			return nil
		})
		if err := rr.stop(t); err != nil {
			t.Fatalf("round %d: Run: %v", round, err)
		}
	}
	pub, dead := split(ids, rows, big)
	published(t, ModeExactlyOnce, readCommitted(t, brokers, "t"), pub)
	deadLettered(t, s, dead, "")
}

// TestMessage_Headers: a record carries each outboxd-* header once. The
// place headers of a row's own (an item's, re-emitted) are kept under their
// outboxd-orig-* names unless the row has those already; of other outboxd-*
// names the last stands; other headers are kept as they are.
func TestMessage_Headers(t *testing.T) {
	h := func(kv ...string) []outbox.Header {
		var hs []outbox.Header
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, outbox.Header{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	cases := []struct {
		name string
		row  []outbox.Header
		want []outbox.Header
	}{
		{"none", nil, nil},
		{"own only, duplicates kept", h("trace", "1", "trace", "2"), h("trace", "1", "trace", "2")},
		{"an item's place headers",
			h("a", "x", HeaderID, "12", HeaderFeed, "up", HeaderEpoch, "E", HeaderPosition, "7", "outboxd-reason", "malformed"),
			h("a", "x", "outboxd-orig-id", "12", "outboxd-orig-feed", "up", "outboxd-orig-epoch", "E",
				"outboxd-orig-position", "7", "outboxd-reason", "malformed")},
		{"orig names already there win",
			h("outboxd-orig-epoch", "first", HeaderEpoch, "later", HeaderID, "3"),
			h("outboxd-orig-epoch", "first", "outboxd-orig-id", "3")},
		{"the last of a name stands",
			h("outboxd-attempts", "1", "outboxd-reason", "old", "k", "v", "outboxd-attempts", "5", "outboxd-reason", "new"),
			h("k", "v", "outboxd-attempts", "5", "outboxd-reason", "new")},
	}
	for _, c := range cases {
		r := outbox.Row{ID: 99, Feed: "f", Epoch: "e1", Position: 41, Topic: "t", Headers: outbox.EncodeHeaders(c.row)}
		m, err := message(&r, []byte(r.Feed), []byte(r.Epoch))
		if err != nil {
			t.Fatal(err)
		}
		want := append(c.want, h(HeaderID, "99", HeaderFeed, "f", HeaderEpoch, "e1", HeaderPosition, "41")...)
		var got []outbox.Header
		for _, rh := range m.rec.Headers {
			got = append(got, outbox.Header{Key: string(rh.Key), Value: rh.Value})
		}
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
			t.Errorf("%s: headers\n got %q\nwant %q", c.name, got, want)
		}
		if n := outbox.PublishedBytes(outbox.Place{Feed: r.Feed, Epoch: r.Epoch, Position: r.Position},
			outbox.Output{Headers: c.row}); n < m.size {
			t.Errorf("%s: PublishedBytes %d below the record's %d", c.name, n, m.size)
		}
	}
}

// TestPublishedBytes_IsSaramas: the bound ingest cuts dead letters by is
// what sarama counts for the record, exactly when the id is at its longest.
func TestPublishedBytes_IsSaramas(t *testing.T) {
	o := outbox.Output{Topic: "t", Key: []byte("key"), Value: fill('v', 5000),
		Headers: []outbox.Header{{Key: "trace", Value: []byte("abc")}, {Key: "outboxd-reason", Value: []byte("malformed")}}}
	p := outbox.Place{Feed: "ledger", Epoch: "65024:9979361:7d453c7ecb0cbfce", Position: 123456789}
	for _, id := range []int64{1, math.MaxInt64} {
		r := outbox.Row{ID: id, Feed: p.Feed, Epoch: p.Epoch, Position: p.Position, Topic: o.Topic, Key: o.Key, Value: o.Value,
			Headers: outbox.EncodeHeaders(o.Headers)}
		m, err := message(&r, []byte(r.Feed), []byte(r.Epoch))
		if err != nil {
			t.Fatal(err)
		}
		bound, size := outbox.PublishedBytes(p, o), m.size
		if bound < size || (id == math.MaxInt64 && bound != size) {
			t.Errorf("id %d: PublishedBytes %d, sarama counts %d", id, bound, size)
		}
	}
}

// TestRecordSlab_Reuse: records made in a reused slab are exactly those a
// new slab makes, whatever the batch before held (more rows, keys, more
// headers), and none of the earlier batch's bytes shows through.
func TestRecordSlab_Reuse(t *testing.T) {
	batch := func(n, headers int, prefix string) []outbox.Row {
		rows := make([]outbox.Row, n)
		for i := range rows {
			var hs []outbox.Header
			for j := range headers {
				hs = append(hs, outbox.Header{Key: fmt.Sprint(prefix, "h", j), Value: []byte(fmt.Sprint(prefix, i, j))})
			}
			rows[i] = outbox.Row{ID: int64(1000*len(prefix) + i + 1), Feed: prefix + "f", Epoch: prefix + "e",
				Position: int64(7 * (i + 1)), Topic: prefix + "t", Value: []byte(fmt.Sprint(prefix, "v", i)),
				Headers: outbox.EncodeHeaders(hs), CreatedAt: int64(i)}
			if i%2 == 0 {
				rows[i].Key = []byte(fmt.Sprint(prefix, "k", i))
			}
		}
		return rows
	}
	first, second := batch(40, 3, "first-"), batch(25, 1, "2-")
	slab := (*recordSlab)(nil).reuse(len(first))
	if _, err := slab.messages(first); err != nil {
		t.Fatal(err)
	}
	reused := slab.reuse(len(second))
	if reused != slab {
		t.Fatal("a slab with room for the batch was not reused")
	}
	got, err := reused.messages(second)
	if err != nil {
		t.Fatal(err)
	}
	want, err := messages(second)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(*got[i], *want[i]) {
			t.Fatalf("record %d from the reused slab\n %+v\nwant %+v", i, *got[i], *want[i])
		}
	}
	if bigger := slab.reuse(len(first) + 1); bigger == slab {
		t.Fatal("a slab too small for the batch was reused")
	}
}
