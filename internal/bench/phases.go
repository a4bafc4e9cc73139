package bench

import (
	"context"
	"fmt"
	"time"
)

// runIngest measures file -> SQLite through the engine, the relay off. Its
// database, a full outbox, is what the relay phase drains.
func (b *bench) runIngest(ctx context.Context) error {
	e, err := b.openEngine(ctx, "ingest")
	if err != nil {
		return err
	}
	b.backlog = e
	start, cpu := time.Now(), startCPU()
	loop, err := e.startLoop(ctx, b.data.Path, b.topic("relay"))
	if err != nil {
		return err
	}
	err = e.waitIngested(ctx, b.data.Size)
	elapsed, used := time.Since(start), cpu.used()
	if serr := loop.stop(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	b.res.Ingest = newPhaseResult(b.data.Lines, elapsed)
	b.res.Ingest.setCPU(used)
	return b.checkOutbox(ctx, e)
}

// checkOutbox checks the ingest phase wrote one output row per line.
func (b *bench) checkOutbox(ctx context.Context, e *benchEngine) error {
	last, err := e.store.LastOutboxID(ctx)
	if err != nil {
		return err
	}
	if last != b.data.Lines {
		b.res.Verify.fail("ingest wrote %d outbox rows for %d lines", last, b.data.Lines)
	}
	return nil
}

// runRelay measures the relay draining the ingest phase's outbox, from
// the moment it is connected (its start-up is reported apart) until Kafka
// has committed the last row. It also samples the memory the drain takes.
func (b *bench) runRelay(ctx context.Context) error {
	e := b.backlog
	defer func() {
		b.backlog = nil
		e.close()
	}()
	topic := b.topic("relay")
	if err := b.createTopics(ctx, topic); err != nil {
		return err
	}
	defer b.doneWithTopic(topic)
	last, err := e.store.LastOutboxID(ctx)
	if err != nil {
		return err
	}
	rss := startRSS(rssEvery)
	res, err := b.drain(ctx, e, last)
	b.res.RSS.setDrain(rss.finish(), last)
	if err != nil {
		return err
	}
	b.res.Relay = res
	return nil
}

// drain runs the relay until it has published row last.
func (b *bench) drain(ctx context.Context, e *benchEngine, last int64) (*phaseResult, error) {
	begin := time.Now()
	r, rt, err := e.startRelay(ctx)
	if err != nil {
		return nil, err
	}
	defer rt.stop()
	if err := e.waitConnected(ctx, r); err != nil {
		return nil, err
	}
	start, before := time.Now(), r.Status().PublishedTotal
	if err := e.waitPublished(ctx, r, last); err != nil {
		return nil, err
	}
	elapsed := time.Since(start)
	res := newPhaseResult(r.Status().PublishedTotal-before, elapsed)
	res.StartupSeconds = round3(start.Sub(begin).Seconds())
	if err := rt.stop(); err != nil {
		return nil, err
	}
	return res, nil
}

// runEndToEnd measures file -> Kafka: a fresh database, the ingest loop and
// the relay started together, until a read_committed consumer has seen an
// output for every line. Then it verifies the outputs and the balances.
func (b *bench) runEndToEnd(ctx context.Context) error {
	topic := b.topic("e2e")
	if err := b.createTopics(ctx, topic); err != nil {
		return err
	}
	defer b.doneWithTopic(topic)
	e, err := b.openEngine(ctx, "e2e")
	if err != nil {
		return err
	}
	defer e.close()
	chk := newOutputCheck(b.data)
	cons, err := b.startConsumer(ctx, topic, e.failed, chk.add)
	if err != nil {
		return err
	}
	defer cons.stop()
	start := time.Now()
	if err := b.pipeline(ctx, e, topic, chk); err != nil {
		return err
	}
	b.res.EndToEnd = newPhaseResult(b.data.Lines, time.Since(start))
	if !b.o.Verify {
		return nil
	}
	return b.verifyEndToEnd(ctx, e, topic, chk, cons)
}

// pipeline runs ingest and relay until chk has seen every line, then stops
// them.
func (b *bench) pipeline(ctx context.Context, e *benchEngine, topic string, chk *outputCheck) error {
	loop, err := e.startLoop(ctx, b.data.Path, topic)
	if err != nil {
		return err
	}
	_, rt, err := e.startRelay(ctx)
	if err != nil {
		loop.stop()
		return err
	}
	err = waitFor(ctx, e.failed, chk.complete, time.Second, func() (bool, error) { return chk.isComplete(), nil })
	if serr := stopAll(loop, rt); err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("wait for %d outputs: %w", b.data.Lines, err)
	}
	return nil
}

// verifyEndToEnd reads the topic to its end (the engine is stopped, so
// nothing more can come) and checks each line's output arrived exactly
// once, the last balance of each account, and the balances in SQLite.
func (b *bench) verifyEndToEnd(ctx context.Context, e *benchEngine, topic string, chk *outputCheck, cons *task) error {
	if err := b.markEnds(ctx, topic); err != nil {
		return err
	}
	err := waitFor(ctx, e.failed, chk.ended, time.Second, func() (bool, error) { return chk.isEnded(), nil })
	if err != nil {
		return fmt.Errorf("read %s to its end: %w", topic, err)
	}
	if err := cons.stop(); err != nil {
		return err
	}
	b.res.Verify.Enabled = true
	chk.verify(b.data, &b.res.Verify)
	return b.verifyBalances(ctx, e)
}
