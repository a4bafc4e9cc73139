package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/internal/natsserver"
)

// The NATS sink's shape: end_to_end_nats is end_to_end with the outputs
// relayed to a JetStream stream by a sink (the Kafka relay off), from the
// server's start until the sink's stored progress is the last output.
// It runs with --nats, where nats-server is installed (Debian's package),
// started by the bench on 127.0.0.1 with its own store in the working
// directory.

// natsStream is the stream the bench's sink publishes to: the default
// stream of a sink that takes every topic (--sink js=nats://...), which
// must exist beforehand with the topics' subjects.
const natsStream = "OUTBOXD"

// startNATS starts nats-server with JetStream on a free port, its store
// under the working directory, and waits until it takes connections.
func (b *bench) startNATS(ctx context.Context, bin string) (*natsserver.Server, string, error) {
	port, err := natsserver.FreePort()
	if err != nil {
		return nil, "", err
	}
	srv, err := natsserver.Start(ctx, bin, port, filepath.Join(b.dir, "nats"), nil)
	if err != nil {
		return nil, "", err
	}
	return srv, natsserver.URL(port), nil
}

// runEndToEndNATS measures file -> JetStream through the server's sink,
// on a fresh database, then checks the stream holds one message per
// output, outbox ids 1 to the last, each once.
func (b *bench) runEndToEndNATS(ctx context.Context) error {
	bin := natsserver.Binary()
	if bin == "" {
		return errors.New("--nats: " + natsserver.Missing)
	}
	ns, url, err := b.startNATS(ctx, bin)
	if err != nil {
		return err
	}
	defer ns.Kill()
	topic := b.topic("nats")
	if err := createBenchStream(ctx, url, topic); err != nil {
		return err
	}
	db := b.engineDB("e2e-nats.db")
	spec := engineSpec{db: db, source: "file:" + b.data.Path, topic: topic, relay: "none",
		extra: []string{"--sink", "js=" + url}}
	res, last, err := b.timeEngine(ctx, "end_to_end_nats", spec, b.data.Lines, "the sink to deliver every output",
		func(e *engineRun) (bool, error) {
			if pos, err := e.w.position(ctx); err != nil || pos < b.data.Size {
				return false, err
			}
			last, err := e.w.store.LastOutboxID(ctx)
			if err != nil {
				return false, err
			}
			done, err := e.w.store.SinkProgress(ctx, "js")
			return done >= last, err
		})
	if err != nil {
		return err
	}
	b.res.EndToEndNATS = res
	if !b.o.Verify {
		return nil
	}
	if err := verifyStream(ctx, url, last); err != nil {
		b.res.Verify.fail("end_to_end_nats: %v", err)
	}
	return nil
}

// createBenchStream makes the stream of the sink, taking the output topic
// and the dead letters' topic.
func createBenchStream(ctx context.Context, url, topic string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connect to nats-server: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: natsStream, Subjects: []string{topic, benchFeed + ".dlq"},
		Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", natsStream, err)
	}
	return nil
}

// verifyStream checks the stream holds last messages, outbox ids 1 to
// last in order.
func verifyStream(ctx context.Context, url string, last int64) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := js.Stream(ctx, natsStream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if int64(info.State.Msgs) != last {
		return fmt.Errorf("the stream holds %d messages, want %d", info.State.Msgs, last)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	for want := int64(1); want <= last; want++ {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			return fmt.Errorf("message %d of %d: %w", want, last, err)
		}
		if got := m.Headers().Get("Outboxd-Id"); got != strconv.FormatInt(want, 10) {
			return fmt.Errorf("message %d has outbox id %s", want, got)
		}
	}
	return nil
}
