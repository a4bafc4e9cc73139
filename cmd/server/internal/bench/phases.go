package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/relay"
)

// engineRun is one engine phase's server and the database it writes.
type engineRun struct {
	b   *bench
	w   *watcher
	srv *serverProc
}

// startEngine creates the database at db (so the server finds it up to
// date), then starts the server on it.
func (b *bench) startEngine(ctx context.Context, s engineSpec) (*engineRun, error) {
	w, err := b.openWatcher(ctx, s.db)
	if err != nil {
		return nil, err
	}
	srv, err := b.startServer(b.serverArgs(s))
	if err != nil {
		w.close()
		return nil, err
	}
	return &engineRun{b: b, w: w, srv: srv}, nil
}

// finish reads the server's CPU time and peak memory into res (and the
// phase's memory under name), then stops it and closes the watcher.
func (e *engineRun) finish(name string, res *phaseResult) error {
	proc, brok, peak := e.srv.usage()
	if res != nil {
		res.CPU = newCPUResult(proc, brok, res.Count)
		res.PeakRSSMiB = peak
	}
	e.b.res.RSS.notePeak(name, peak)
	return e.close()
}

// close stops the server and closes the watcher.
func (e *engineRun) close() error {
	err := e.srv.stop()
	if cerr := e.w.close(); err == nil {
		err = cerr
	}
	return err
}

// runIngest measures file -> SQLite through the server, the relay off:
// from the server's start until the feed's stored position is the file's
// end. Its database, a full outbox, is what the relay phase drains.
func (b *bench) runIngest(ctx context.Context) error {
	b.backlog = b.engineDB("ingest.db")
	settleDisk()
	res, err := b.ingestFile(ctx, "ingest", b.ingestSpec(b.backlog, b.data), b.data)
	if err != nil {
		return err
	}
	b.res.Ingest = res
	return nil
}

// ingestSpec is an ingest phase's server: the file of d into db, relay
// off.
func (b *bench) ingestSpec(db string, d lineData) engineSpec {
	return engineSpec{db: db, source: "file:" + d.Path, topic: b.topic("relay"), relay: "none"}
}

// timeEngine runs the server of s from its start until done says so, as a
// phase of count items, and returns the phase and the last outbox id it
// wrote.
func (b *bench) timeEngine(ctx context.Context, name string, s engineSpec, count int64, what string,
	done func(*engineRun) (bool, error)) (*phaseResult, int64, error) {
	e, err := b.startEngine(ctx, s)
	if err != nil {
		return nil, 0, err
	}
	err = waitUntil(ctx, e.srv, what, func() (bool, error) { return done(e) })
	res := newPhaseResult(count, time.Since(e.srv.start))
	if err != nil {
		e.close()
		return nil, 0, err
	}
	last, err := e.w.store.LastOutboxID(ctx)
	if ferr := e.finish(name, res); err == nil {
		err = ferr
	}
	if err != nil {
		return nil, 0, err
	}
	return res, last, nil
}

// timeBacklog runs the server of s over the backlog's outbox, and times
// it until its progress reaches the outbox's last row, from its first
// progress, so the start-up (connecting, fencing, reading the progress
// back) is reported apart. progress is how far the server is: the last row
// delivered, and when the first was (zero: the phase cannot tell, and is
// timed from the first progress it sees, counting the rows after it). what
// says so in an error, with %d the last row.
func (b *bench) timeBacklog(ctx context.Context, name string, s engineSpec, what string,
	progress func(*engineRun) (done int64, started time.Time, err error)) (*phaseResult, error) {
	e, err := b.startEngine(ctx, s)
	if err != nil {
		return nil, err
	}
	last, err := e.w.store.LastOutboxID(ctx)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("%s: the backlog's last row: %w", name, err)
	}
	var first int64
	var firstAt time.Time
	err = waitUntil(ctx, e.srv, fmt.Sprintf(what, last), func() (bool, error) {
		id, started, err := progress(e)
		switch {
		case !started.IsZero():
			first, firstAt = 0, started
		case id > 0 && first == 0:
			first, firstAt = id, time.Now()
		}
		return id >= last, err
	})
	if err != nil {
		e.close()
		return nil, err
	}
	res := newPhaseResult(last-first, time.Since(firstAt))
	res.StartupSeconds = round3(firstAt.Sub(e.srv.start).Seconds())
	if err := e.finish(name, res); err != nil {
		return nil, err
	}
	return res, nil
}

// ingestFile runs the server of s over d, and checks it wrote one outbox
// row per line.
func (b *bench) ingestFile(ctx context.Context, name string, s engineSpec, d lineData) (*phaseResult, error) {
	res, last, err := b.timeEngine(ctx, name, s, d.Lines, fmt.Sprintf("the feed to reach %d", d.Size),
		func(e *engineRun) (bool, error) {
			pos, err := e.w.position(ctx)
			return pos >= d.Size, err
		})
	if err != nil {
		return nil, err
	}
	if last != d.Lines {
		b.res.Verify.fail("%s wrote %d outbox rows for %d lines", name, last, d.Lines)
	}
	return res, nil
}

// runRelay measures the server's relay draining the ingest phase's outbox:
// the rows published from its first progress until its last row, so the
// start-up (connecting, fencing, reading the progress back) is reported
// apart.
func (b *bench) runRelay(ctx context.Context) error {
	topic := b.topic("relay")
	if err := b.createTopics(ctx, topic); err != nil {
		return err
	}
	defer b.doneWithTopic(topic)
	res, err := b.timeBacklog(ctx, "relay", engineSpec{db: b.backlog, source: "file:" + b.data.Path, topic: topic, relay: "exactly-once"},
		"the relay to publish row %d", func(e *engineRun) (int64, time.Time, error) {
			id, err := e.w.store.MaxRelayProgress(ctx)
			return id, time.Time{}, err
		})
	if err != nil {
		return err
	}
	b.res.Relay = res
	return nil
}

// runEndToEnd measures file -> Kafka through the server, on a fresh
// database: from its start until a read_committed consumer has seen an
// output for every line. Then it verifies the outputs and the balances.
func (b *bench) runEndToEnd(ctx context.Context) error {
	topic := b.topic("e2e")
	if err := b.createTopics(ctx, topic); err != nil {
		return err
	}
	defer b.doneWithTopic(topic)
	failed := make(chan error, 1)
	db := b.engineDB("e2e.db")
	// Timed until the relay's progress record naming the last output is
	// committed: then the topic holds every line's output, visible to a
	// read_committed consumer. The consumer that checks them runs after,
	// so that its work (about a core's third while the server runs) is
	// not taken from the server.
	watch, published, err := b.watchProgress(ctx, db, b.data.Lines, failed)
	if err != nil {
		return err
	}
	defer watch.stop()
	e, err := b.startEngine(ctx, engineSpec{db: db, source: "file:" + b.data.Path, topic: topic, relay: "exactly-once"})
	if err != nil {
		return err
	}
	done := false
	err = waitFor(ctx, failed, published, pollEvery, func() (bool, error) {
		select {
		case <-published:
			done = true
		default:
		}
		return done, e.srv.exited()
	})
	res := newPhaseResult(b.data.Lines, time.Since(e.srv.start))
	if err != nil {
		e.close()
		return fmt.Errorf("wait for %d outputs: %w", b.data.Lines, err)
	}
	if err := e.finish("end_to_end", res); err != nil {
		return err
	}
	b.res.EndToEnd = res
	if !b.o.Verify {
		return nil
	}
	chk := newOutputCheck(b.data, b.o.Processor)
	cons, err := b.startConsumer(ctx, topic, failed, chk.add)
	if err != nil {
		return err
	}
	defer cons.stop()
	return b.verifyEndToEnd(ctx, db, topic, chk, cons, failed)
}

// watchProgress follows the relay's progress topic, read_committed, from
// its start, until a progress record of the database at path names an
// output id of at least last: published is closed then. Each Kafka
// transaction of the relay commits one such record with its outputs.
func (b *bench) watchProgress(ctx context.Context, path string, last int64, failed chan<- error) (*task, <-chan struct{}, error) {
	// The relay stamps its database's absolute path, its directory's
	// links resolved.
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, fmt.Errorf("watch the relay's progress: %w", err)
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(dir, filepath.Base(abs))
	}
	published := make(chan struct{})
	var once sync.Once
	t, err := b.startConsumer(ctx, b.topic("progress"), failed, func(r *kafka.Record, _ time.Time) {
		p, err := relay.DecodeProgress(r.Value)
		if err == nil && p.Path == abs && p.LastID >= last {
			once.Do(func() { close(published) })
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("watch the relay's progress: %w", err)
	}
	return t, published, nil
}

// verifyEndToEnd reads the topic to its end (the server is stopped, so
// nothing more can come) and checks each line's output arrived exactly
// once, the last balance of each account, and the balances in SQLite.
func (b *bench) verifyEndToEnd(ctx context.Context, db, topic string, chk *outputCheck, cons *task, failed chan error) error {
	if err := b.markEnds(ctx, topic); err != nil {
		return err
	}
	err := waitFor(ctx, failed, chk.ended, time.Second, func() (bool, error) { return chk.isEnded(), nil })
	if err != nil {
		return fmt.Errorf("read %s to its end: %w", topic, err)
	}
	if err := cons.stop(); err != nil {
		return err
	}
	b.res.Verify.Enabled = true
	chk.verify(b.data, &b.res.Verify)
	if b.o.Processor != "ledger" || b.data.Sums == nil {
		return nil
	}
	w, err := b.openWatcher(ctx, db)
	if err != nil {
		return err
	}
	defer w.close()
	return b.verifyBalances(ctx, w)
}

// task is a component (a consumer) running in the background until
// stopped.
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

// settleDisk writes every dirty page to disk before an ingest phase, so
// that ingest and ingest_recorded each start with none left by the phase
// before (ingest_recorded follows ingest's 200-odd MiB of database, which
// the kernel would otherwise write back while it runs, beside its fsyncs).
func settleDisk() { syscall.Sync() }
