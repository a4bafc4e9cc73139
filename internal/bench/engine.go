package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/server"
)

// benchFeed is the feed name of every engine phase (each has its own database).
const benchFeed = "ledger"

// relayPoll is how often a phase looks at the relay's status; it bounds
// how much a relay measurement can overstate.
const relayPoll = time.Millisecond

// task is one component (an ingest loop, the relay, a consumer) running in
// the background until stopped.
type task struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startTask runs run on its own goroutine. An error run returns before the
// task is stopped is also sent to failed (without blocking), so that a
// phase waiting on something else learns of it at once.
func startTask(ctx context.Context, name string, failed chan<- error, run func(context.Context) error) *task {
	ctx, cancel := context.WithCancel(ctx)
	t := &task{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		if err := run(ctx); err != nil {
			t.err = fmt.Errorf("%s: %w", name, err)
			select {
			case failed <- t.err:
			default:
			}
		}
	}()
	return t
}

// stop cancels the task, waits for it and returns its error.
func (t *task) stop() error {
	t.cancel()
	<-t.done
	return t.err
}

// waitFor returns once cond holds, testing it at every wake and at least
// every interval; it returns early with ctx's error or a task's failure.
func waitFor(ctx context.Context, failed <-chan error, wake <-chan struct{}, every time.Duration,
	cond func() (bool, error)) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-failed:
			return err
		case <-wake:
		case <-t.C:
		}
	}
}

// benchEngine is outboxd's own ingest loop and relay on one database, wired
// as Main wires them, with the bench's settings.
type benchEngine struct {
	b       *bench
	store   *outbox.Store
	batches chan struct{} // signalled after every committed ingest batch
	failed  chan error
}

// openEngine opens (creating) the database name.db and claims it, as the
// server does: every commit then checks the claim.
func (b *bench) openEngine(ctx context.Context, name string) (*benchEngine, error) {
	cfg := outbox.DefaultConfig(b.path(name + ".db"))
	cfg.Synchronous = b.o.Synchronous
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := s.Claim(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return &benchEngine{b: b, store: s, batches: make(chan struct{}, 1), failed: make(chan error, 4)}, nil
}

// startLoop runs an ingest loop: the file at path through the ledger
// processor, its outputs to topic.
func (e *benchEngine) startLoop(ctx context.Context, path, topic string) (*task, error) {
	return e.startLoopRecorded(ctx, path, topic, nil)
}

// startLoopRecorded is startLoop with a recorder (nil: none).
func (e *benchEngine) startLoopRecorded(ctx context.Context, path, topic string, rec ingest.Recorder) (*task, error) {
	o := e.b.o
	cfg := ingest.DefaultConfig(benchFeed)
	cfg.Processor = ledger.Name
	cfg.BatchMax, cfg.BatchWait = o.BatchMax, o.BatchWait
	cfg.DeadLetterTopic = e.b.topic("dlq")
	cfg.Logger = e.b.log
	cfg.OnBatch = func(int, time.Duration) {
		select {
		case e.batches <- struct{}{}:
		default:
		}
	}
	cfg.Recorder = rec
	feed := filefeed.New(path, filefeed.Options{MaxLine: server.DefaultConfig().MaxLine, Logger: e.b.log})
	l, err := ingest.NewLoop(e.store, feed, ledger.New(topic), cfg)
	if err != nil {
		return nil, err
	}
	return startTask(ctx, "ingest", e.failed, l.Run), nil
}

// startRelay runs the relay on the engine's database.
func (e *benchEngine) startRelay(ctx context.Context) (*relay.Relay, *task, error) {
	o := e.b.o
	cfg := relay.DefaultConfig()
	cfg.Brokers = e.b.brokers
	cfg.Batch, cfg.Wait = o.RelayBatch, o.RelayWait
	cfg.ProgressTopic = e.b.topic("progress")
	cfg.Logger = e.b.log
	r, err := relay.New(e.store, cfg)
	if err != nil {
		return nil, nil, err
	}
	return r, startTask(ctx, "relay", e.failed, r.Run), nil
}

// waitIngested waits until the feed's stored position is end.
func (e *benchEngine) waitIngested(ctx context.Context, end int64) error {
	err := waitFor(ctx, e.failed, e.batches, 50*time.Millisecond, func() (bool, error) {
		cps, err := e.store.ReadPositions(ctx, benchFeed)
		if err != nil {
			return false, err
		}
		return len(cps) == 1 && cps[0].Position >= end, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the feed to reach %d: %w", end, err)
	}
	return nil
}

// waitConnected waits until the relay is ready to publish.
func (e *benchEngine) waitConnected(ctx context.Context, r *relay.Relay) error {
	err := waitFor(ctx, e.failed, nil, relayPoll, func() (bool, error) { return r.Status().Connected, nil })
	if err != nil {
		return fmt.Errorf("wait for the relay to connect: %w", err)
	}
	return nil
}

// waitPublished waits until the relay has published every row up to last.
func (e *benchEngine) waitPublished(ctx context.Context, r *relay.Relay, last int64) error {
	err := waitFor(ctx, e.failed, nil, relayPoll, func() (bool, error) { return r.Status().LastPublishedID >= last, nil })
	if err != nil {
		return fmt.Errorf("wait for the relay to publish row %d: %w", last, err)
	}
	return nil
}

// close closes the database.
func (e *benchEngine) close() error {
	if err := e.store.Close(); err != nil {
		return fmt.Errorf("close %s: %w", e.store.Path(), err)
	}
	return nil
}

// stopAll stops tasks in order and joins their errors.
func stopAll(ts ...*task) error {
	var errs []error
	for _, t := range ts {
		if t != nil {
			errs = append(errs, t.stop())
		}
	}
	return errors.Join(errs...)
}
