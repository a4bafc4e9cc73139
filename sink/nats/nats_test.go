package nats_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/natstest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
	"github.com/outboxd/outboxd/sink"
	snats "github.com/outboxd/outboxd/sink/nats"
)

var quiet = slog.New(slog.DiscardHandler)

func parseURL(s string) (*url.URL, error) { return url.Parse(s) }

func spec(t *testing.T, srv *natstest.Server, name string, opts map[string]string, topics map[string]sink.TopicMap) sink.Spec {
	t.Helper()
	u, err := url.Parse(srv.URL())
	testutil.Must(t, err)
	return sink.Spec{Name: name, URL: u, Options: opts, Topics: topics, Logger: quiet}
}

func newTarget(t testing.TB, sp sink.Spec) *snats.Target {
	t.Helper()
	tg, err := snats.New(sp)
	testutil.Must(t, err)
	t.Cleanup(func() { tg.Close() })
	return tg
}

func rowsOf(from, n int, topic string) []outbox.Row {
	out := make([]outbox.Row, n)
	for i := range out {
		id := int64(from + i)
		out[i] = outbox.Row{ID: id, Feed: "f", Epoch: "e", Position: id, Topic: topic,
			Key: []byte(fmt.Sprint("k", id%3)), Value: []byte(fmt.Sprint("v", id)),
			Headers: outbox.EncodeHeaders([]outbox.Header{{Key: "X-H", Value: []byte("h" + strconv.FormatInt(id, 10))}})}
	}
	return out
}

// streamMsgs reads every message of a stream, in sequence order.
func streamMsgs(t *testing.T, srv *natstest.Server, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	testutil.Must(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	testutil.Must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	testutil.Must(t, err)
	info, err := s.Info(ctx)
	testutil.Must(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// ours is the outbox ids of the sink's messages, in stream order.
func ours(msgs []*jetstream.RawStreamMsg, name string) []int64 {
	var ids []int64
	for _, m := range msgs {
		if m.Header.Get(snats.HeaderSink) == name {
			id, _ := strconv.ParseInt(m.Header.Get(snats.HeaderID), 10, 64)
			ids = append(ids, id)
		}
	}
	return ids
}

// wantIDs checks ids are from..to, each once, in order.
func wantIDs(t *testing.T, ids []int64, from, to int64) {
	t.Helper()
	if int64(len(ids)) != to-from+1 {
		t.Fatalf("%d messages of the sink, want %d (ids %d to %d): %v", len(ids), to-from+1, from, to, ids)
	}
	for i, id := range ids {
		if id != from+int64(i) {
			t.Fatalf("message %d has id %d, want %d: %v", i, id, from+int64(i), ids)
		}
	}
}

func TestTarget_ExactMessages(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	tg := newTarget(t, spec(t, srv, "ev", map[string]string{"stream": "EV", "inflight": "7"},
		map[string]sink.TopicMap{"a.out": {}, "b.out": {Subject: "bee.subject"}}))
	last, err := tg.Resume(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "resume of a new stream", last, int64(0))
	rows := append(rowsOf(1, 30, "a.out"), rowsOf(31, 20, "b.out")...)
	rows[0].Key = []byte{0, 1, 0xff}
	dls, err := tg.Deliver(ctx, rows)
	testutil.Must(t, err)
	testutil.Equal(t, "dead letters", len(dls), 0)
	msgs := streamMsgs(t, srv, "EV")
	testutil.Equal(t, "messages", len(msgs), 50)
	for i, m := range msgs {
		r := rows[i]
		wantSubj := map[string]string{"a.out": "a.out", "b.out": "bee.subject"}[r.Topic]
		if m.Subject != wantSubj || string(m.Data) != string(r.Value) || m.Sequence != uint64(i+1) ||
			m.Header.Get(snats.HeaderID) != strconv.FormatInt(r.ID, 10) || m.Header.Get("Nats-Msg-Id") != fmt.Sprint("ev-", r.ID) ||
			m.Header.Get(snats.HeaderTopic) != r.Topic || m.Header.Get("X-H") != fmt.Sprint("h", r.ID) ||
			m.Header.Get(snats.HeaderPosition) != fmt.Sprintf("0:e:%d", r.ID) || m.Header.Get(snats.HeaderFeed) != "f" {
			t.Fatalf("message %d: %s %q %v, want row %+v", i, m.Subject, m.Data, m.Header, r)
		}
		if i == 0 && (m.Header.Get(snats.HeaderKeyBytes) != "0001ff" || m.Header.Get(snats.HeaderKey) != "") {
			t.Fatalf("binary key: %v", m.Header)
		}
		if i == 1 && m.Header.Get(snats.HeaderKey) != "k2" {
			t.Fatalf("text key: %v", m.Header)
		}
	}
	// A new target (a restart) learns the last id from the stream.
	tg2 := newTarget(t, spec(t, srv, "ev", map[string]string{"stream": "EV"},
		map[string]sink.TopicMap{"a.out": {}, "b.out": {Subject: "bee.subject"}}))
	last, err = tg2.Resume(ctx)
	testutil.Must(t, err)
	testutil.Equal(t, "resume", last, int64(50))
}

// TestTarget_ResumeAfterLostAcks: rows published while the server is
// stopped (SIGSTOP) time out unacknowledged, then land once it goes on;
// a delivery again from the start (the store's progress never moved)
// adds each missing row once.
func TestTarget_ResumeAfterLostAcks(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	sp := spec(t, srv, "ev", map[string]string{"stream": "EV", "timeout": "500ms"}, map[string]sink.TopicMap{"a": {}})
	tg := newTarget(t, sp)
	_, err := tg.Resume(ctx)
	testutil.Must(t, err)
	_, err = tg.Deliver(ctx, rowsOf(1, 10, "a"))
	testutil.Must(t, err)
	proc := serverProcess(t, srv)
	testutil.Must(t, proc.Signal(syscall.SIGSTOP))
	testutil.Wait(t, 10*time.Second, func() error { return stopped(srv.Process().Pid) })
	_, err = tg.Deliver(ctx, rowsOf(11, 10, "a"))
	testutil.Must(t, proc.Signal(syscall.SIGCONT))
	if err == nil {
		t.Fatal("a delivery to a stopped server succeeded")
	}
	// Everything sent lands now, acked to no one.
	var last int64
	testutil.Wait(t, 20*time.Second, func() error {
		var err error
		last, err = tg.Resume(ctx)
		if err != nil {
			return err
		}
		if last != 20 {
			return fmt.Errorf("resume %d", last)
		}
		return nil
	})
	_, err = tg.Deliver(ctx, rowsOf(1, 30, "a")) // from the store's progress: 0
	testutil.Must(t, err)
	wantIDs(t, ours(streamMsgs(t, srv, "EV"), "ev"), 1, 30)
}

// TestTarget_AnotherWriter: another writer publishing to the sink's
// subject all along (about 500 messages a second) never makes a row
// appear twice or out of order, and its messages stay.
func TestTarget_AnotherWriter(t *testing.T) {
	srv := natstest.Start(t)
	s := outboxtest.TempStore(t)
	sp := spec(t, srv, "ev", map[string]string{"stream": "EV", "inflight": "64"}, map[string]sink.TopicMap{"a": {Subject: "shared"}})
	tg := newTarget(t, sp)
	r, err := sink.NewRunner(s, sp, tg, sink.Config{Batch: 200, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	testutil.Must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
	}()
	// The stream exists once the runner resumed.
	testutil.Wait(t, 20*time.Second, func() error {
		if st := r.Status(); st.State != sink.StateIdle {
			return fmt.Errorf("state %s: %s", st.State, st.LastError)
		}
		return nil
	})
	other, err := nats.Connect(srv.URL())
	testutil.Must(t, err)
	defer other.Close()
	ojs, err := jetstream.New(other)
	testutil.Must(t, err)
	stop := make(chan struct{})
	var others int
	var owg sync.WaitGroup
	owg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := ojs.Publish(context.Background(), "shared", []byte("other")); err == nil {
				others++
			}
			time.Sleep(2 * time.Millisecond) // a writer of its own pace (one publishing flat out starves the sink: see the package doc)
		}
	})
	for c := range 10 {
		emit(t, s, c*200, 200, "a")
	}
	waitStored(t, s, r, 2000)
	close(stop)
	owg.Wait()
	msgs := streamMsgs(t, srv, "EV")
	wantIDs(t, ours(msgs, "ev"), 1, 2000)
	testutil.Equal(t, "the other writer's messages", len(msgs)-2000, others)
	st := r.Status()
	t.Logf("other writer: %d messages; sink: %d errors (each a delivery another message broke)", others, st.Errors)
	if others == 0 {
		t.Fatal("the other writer published nothing")
	}
}

// TestTarget_StreamMissing: with createStream=false a missing stream is
// a clear error; by default it is created with the sink's subjects.
func TestTarget_StreamMissing(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	tg := newTarget(t, spec(t, srv, "ev", map[string]string{"stream": "NOPE", "createStream": "false"}, map[string]sink.TopicMap{"a": {}}))
	_, err := tg.Resume(ctx)
	if err == nil || !strings.HasPrefix(err.Error(), "stream NOPE: ") || !strings.Contains(err.Error(), "stream not found") ||
		!strings.HasSuffix(err.Error(), "(createStream is false: create it, with the subjects [a])") {
		t.Fatalf("Resume: %v", err)
	}
	tg2 := newTarget(t, spec(t, srv, "ev", map[string]string{"stream": "MADE"},
		map[string]sink.TopicMap{"a": {}, "b": {Subject: "x.y"}, "c": {Stream: "OTHER"}}))
	_, err = tg2.Resume(ctx)
	testutil.Must(t, err)
	nc, err := nats.Connect(srv.URL())
	testutil.Must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, "MADE")
	testutil.Must(t, err)
	info, err := st.Info(ctx)
	testutil.Must(t, err)
	if fmt.Sprint(info.Config.Subjects) != "[a x.y]" {
		t.Fatalf("subjects %v", info.Config.Subjects)
	}
	// A stream that does not take a mapped subject is an error.
	tg3 := newTarget(t, spec(t, srv, "ev", map[string]string{"stream": "MADE"}, map[string]sink.TopicMap{"z": {}}))
	if _, err := tg3.Resume(ctx); err == nil || !strings.Contains(err.Error(), "stream MADE takes subjects [a x.y], not z") {
		t.Fatalf("Resume: %v", err)
	}
}

// TestTarget_TooLarge: a row larger than the stream takes is refused
// before publishing; the others go on.
func TestTarget_TooLarge(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	nc, err := nats.Connect(srv.URL())
	testutil.Must(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"a"}, MaxMsgSize: 2048})
	testutil.Must(t, err)
	tg := newTarget(t, spec(t, srv, "ev", map[string]string{"stream": "SMALL"}, map[string]sink.TopicMap{"a": {}}))
	_, err = tg.Resume(ctx)
	testutil.Must(t, err)
	rows := rowsOf(1, 3, "a")
	rows[1].Value = make([]byte, 4096)
	keep, refused := tg.Screen(rows)
	if len(keep) != 2 || len(refused) != 1 || refused[0].Row.ID != 2 || refused[0].Reason != snats.ReasonTooLarge {
		t.Fatalf("keep %d, refused %+v", len(keep), refused)
	}
	_, err = tg.Deliver(ctx, keep)
	testutil.Must(t, err)
	wantMsgs := ours(streamMsgs(t, srv, "SMALL"), "ev")
	if fmt.Sprint(wantMsgs) != "[1 3]" {
		t.Fatalf("messages %v", wantMsgs)
	}
}

// TestRunner_NATSDownThenUp: the server killed (SIGKILL) while rows
// wait, then started again on its store: every row is in the stream
// once, in order.
func TestRunner_NATSDownThenUp(t *testing.T) {
	srv := natstest.Start(t)
	s := outboxtest.TempStore(t)
	sp := spec(t, srv, "ev", map[string]string{"stream": "EV", "timeout": "1s"}, map[string]sink.TopicMap{"a": {}})
	tg := newTarget(t, sp)
	r, err := sink.NewRunner(s, sp, tg, sink.Config{Batch: 100, MinBackoff: 5 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	testutil.Must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
	}()
	emit(t, s, 0, 500, "a")
	waitStored(t, s, r, 500)
	srv.Stop()
	emit(t, s, 500, 500, "a")
	testutil.Wait(t, 20*time.Second, func() error {
		if st := r.Status(); st.State != sink.StateBackingOff {
			return fmt.Errorf("state %s", st.State)
		}
		return nil
	})
	srv.Restart()
	emit(t, s, 1000, 500, "a")
	waitStored(t, s, r, 1500)
	wantIDs(t, ours(streamMsgs(t, srv, "EV"), "ev"), 1, 1500)
}

func emit(t *testing.T, s *outbox.Store, from, n int, topic string) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	testutil.Must(t, err)
	defer tx.Rollback()
	for i := from; i < from+n; i++ {
		testutil.Must(t, tx.BeginItem(outbox.Place{Feed: "f", Epoch: "e", Position: int64(i + 1)}))
		testutil.Must(t, tx.Emit(ctx, outbox.Output{Topic: topic, Value: []byte(fmt.Sprint("v", i+1))}))
		testutil.Must(t, tx.EndItem())
	}
	testutil.Must(t, tx.Commit())
}

func waitStored(t *testing.T, s *outbox.Store, r *sink.Runner, id int64) {
	t.Helper()
	testutil.Wait(t, 60*time.Second, func() error {
		got, err := s.SinkProgress(context.Background(), r.Name())
		if err != nil {
			return err
		}
		if got != id {
			return fmt.Errorf("stored %d, want %d (status %+v)", got, id, r.Status())
		}
		return nil
	})
}

func serverProcess(t *testing.T, srv *natstest.Server) interface{ Signal(os.Signal) error } {
	t.Helper()
	p := srv.Process()
	if p == nil {
		t.Fatal("the server is not running")
	}
	return p
}

// stopped says whether process pid is stopped (state T in /proc).
func stopped(pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return err
	}
	// pid (comm) STATE ...: the state follows the last ')'.
	rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
	if f := strings.Fields(rest); len(f) == 0 || f[0] != "T" {
		return fmt.Errorf("process %d state %q, not stopped yet", pid, f)
	}
	return nil
}
