package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/internal/kafka"
)

// latencyRun is what the latency phase's writer and consumer share: each
// line's position and append time. The writer stores a line's time before
// the write that appends it; the consumer reads it when the line's output
// arrives.
type latencyRun struct {
	accounts  int
	lineBytes int
	fill      string
	positions []int64        // each line's position, ascending
	appended  []atomic.Int64 // each line's append time, unix nanoseconds
	writing   time.Duration  // from the first measured line's append to the last's (the writer's)

	// The consumer's alone until it stops.
	seen      bitset // by line index
	latencies []time.Duration
	// toRelay and fromRelay split each latency at the record's timestamp,
	// the time the relay made its batch (--relay's default timestamp,
	// publish; to the millisecond): append -> batch made (the feed, the
	// loop's batch and commit, the relay's wait) and batch made -> visible
	// (the Kafka transaction, the consumer's fetch).
	toRelay, fromRelay []time.Duration
	stats              checkStats

	mu       sync.Mutex
	distinct int64
	complete chan struct{} // closed once every line's output was seen
	warm     chan struct{} // closed once the warm-up line's output was seen
}

// newLatencyRun prepares n lines. The first is a warm-up: it is appended
// alone, and the measured lines follow once its output was seen, so the
// server's start-up is not counted as latency.
func newLatencyRun(accounts, lineBytes int, fill string, n int64) *latencyRun {
	n++ // the warm-up line
	lr := &latencyRun{accounts: accounts, lineBytes: lineBytes, fill: fill, positions: make([]int64, n), appended: make([]atomic.Int64, n),
		seen: newBitset(n), latencies: make([]time.Duration, 0, n), complete: make(chan struct{}), warm: make(chan struct{})}
	g := newLineGen(accounts, lineBytes, fill)
	for i := range lr.positions {
		l, _ := g.next()
		lr.positions[i] = l.Position
	}
	return lr
}

// runLatency measures, at each offered load of --latency-rates (lines/s
// for --latency-duration), the time from a line's append to the file to
// its output being visible to a read_committed consumer, ingest and relay
// running on a fresh database each time; and first the disk's fdatasync
// latency, which bounds a commit of synchronous=full from below.
func (b *bench) runLatency(ctx context.Context) error {
	if len(b.o.LatencyRates) == 0 {
		return nil
	}
	sync, err := measureFdatasync(b.path("fdatasync.probe"), fdatasyncProbes)
	if err != nil {
		return err
	}
	b.res.FDataSync = sync
	for _, rate := range b.o.LatencyRates {
		if b.o.latencyLines(rate) == 0 {
			continue
		}
		b.say("latency at %d lines/s ...", rate)
		p, err := b.latencyPoint(ctx, rate)
		if err != nil {
			return fmt.Errorf("at %d lines/s: %w", rate, err)
		}
		b.res.LatencyCurve = append(b.res.LatencyCurve, p)
		if b.res.Latency == nil || rate == latencyHeadline {
			b.res.Latency = p
		}
	}
	return nil
}

// latencyHeadline is the rate whose point is the result's "latency" too
// (the first point when the curve lacks it): the load the figure had
// before the phase measured a curve.
const latencyHeadline = 10_000

// latencyPoint is one point of the latency curve: rate lines/s.
func (b *bench) latencyPoint(ctx context.Context, rate int) (*latencyResult, error) {
	name := fmt.Sprintf("latency%d", rate)
	topic := b.topic(name)
	path, err := b.inputPath(name + ".csv")
	if err != nil {
		return nil, err
	}
	if err := b.createTopics(ctx, topic); err != nil {
		return nil, err
	}
	defer b.doneWithTopic(topic)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return nil, fmt.Errorf("create latency file: %w", err)
	}
	lr := newLatencyRun(b.o.Accounts, b.o.LineBytes, b.o.LineFill, b.o.latencyLines(rate))
	if err := b.measureLatency(ctx, lr, path, topic, name, rate); err != nil {
		return nil, err
	}
	b.res.Verify.LatencyDuplicates += lr.stats.duplicates
	if lr.stats.duplicates > 0 || lr.stats.foreign > 0 {
		b.res.Verify.fail("latency at %d lines/s: %d duplicate outputs, %d outputs of no line", rate, lr.stats.duplicates, lr.stats.foreign)
	}
	return lr.result(b.o, rate, b.res.FDataSync), nil
}

// measureLatency runs the server and a consumer while the writer appends,
// until every line's output has been seen.
func (b *bench) measureLatency(ctx context.Context, lr *latencyRun, path, topic, name string, rate int) error {
	failed := make(chan error, 1)
	cons, err := b.startConsumer(ctx, topic, failed, lr.add)
	if err != nil {
		return err
	}
	defer cons.stop()
	e, err := b.startEngine(ctx, engineSpec{db: b.engineDB(name + ".db"), source: "file:" + path, topic: topic, relay: "exactly-once"})
	if err != nil {
		return err
	}
	err = lr.write(ctx, path, rate, func() error {
		return waitFor(ctx, failed, lr.warm, pollEvery, func() (bool, error) { return lr.isWarm(), e.srv.exited() })
	})
	if err == nil {
		err = waitFor(ctx, failed, lr.complete, pollEvery, func() (bool, error) {
			ok, _ := lr.isComplete()
			return ok, e.srv.exited()
		})
	}
	if ferr := e.finish(name, nil); err == nil {
		err = ferr
	}
	if serr := cons.stop(); err == nil {
		err = serr
	}
	return err
}

// write appends the warm-up line, calls warmed (which returns once its
// output was seen), then appends the other lines at rate lines/s: each line
// when it is due, those that fell due together in one write.
func (lr *latencyRun) write(ctx context.Context, path string, rate int, warmed func() error) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open latency file: %w", err)
	}
	defer f.Close()
	g, n := newLineGen(lr.accounts, lr.lineBytes, lr.fill), int64(len(lr.positions))
	_, text := g.next()
	lr.appended[0].Store(time.Now().UnixNano())
	if _, err := f.Write(text); err != nil {
		return fmt.Errorf("append to latency file: %w", err)
	}
	if err := warmed(); err != nil {
		return fmt.Errorf("wait for the first line's output: %w", err)
	}
	buf := make([]byte, 0, 64<<10)
	start := time.Now()
	defer func() { lr.writing = time.Since(start) }()
	for i := int64(1); i < n; {
		if err := ctx.Err(); err != nil {
			return err
		}
		due := min(n, int64(time.Since(start).Seconds()*float64(rate))+2)
		if due <= i {
			time.Sleep(time.Until(start.Add(time.Duration(float64(i-1) / float64(rate) * float64(time.Second)))))
			continue
		}
		buf = buf[:0]
		now := time.Now().UnixNano()
		for ; i < due; i++ {
			_, text := g.next()
			buf = append(buf, text...)
			lr.appended[i].Store(now)
		}
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("append to latency file: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close latency file: %w", err)
	}
	return nil
}

// add takes one consumed record, arrived at at.
func (lr *latencyRun) add(r *kafka.Record, at time.Time) {
	pos, ok := recordPosition(r)
	i, found := slices.BinarySearch(lr.positions, pos)
	if !ok || !found {
		lr.stats.foreign++
		return
	}
	if lr.seen.set(int64(i)) {
		lr.stats.duplicates++
		return
	}
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if i == 0 {
		close(lr.warm)
	} else {
		appended := time.Unix(0, lr.appended[i].Load())
		lr.latencies = append(lr.latencies, at.Sub(appended))
		lr.toRelay = append(lr.toRelay, max(0, r.Timestamp.Sub(appended)))
		lr.fromRelay = append(lr.fromRelay, max(0, at.Sub(r.Timestamp)))
	}
	if lr.distinct++; lr.distinct == int64(len(lr.positions)) {
		close(lr.complete)
	}
}

// isWarm reports whether the warm-up line's output was seen.
func (lr *latencyRun) isWarm() bool {
	select {
	case <-lr.warm:
		return true
	default:
		return false
	}
}

// isComplete reports whether every line's output was seen.
func (lr *latencyRun) isComplete() (bool, error) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.distinct >= int64(len(lr.positions)), nil
}

// result is the latency percentiles of the measured lines at rate, and
// p99's ratio to the disk's (sync). Call it once the consumer has stopped.
func (lr *latencyRun) result(o benchOptions, rate int, sync *syncResult) *latencyResult {
	slices.Sort(lr.latencies)
	slices.Sort(lr.toRelay)
	slices.Sort(lr.fromRelay)
	r := &latencyResult{
		Rate: rate, Seconds: o.LatencyDuration.Seconds(), Lines: int64(len(lr.latencies)),
		P50Ms:          millis(percentile(lr.latencies, 0.50)),
		P99Ms:          millis(percentile(lr.latencies, 0.99)),
		MaxMs:          millis(percentile(lr.latencies, 1)),
		ToRelayP50Ms:   millis(percentile(lr.toRelay, 0.50)),
		ToRelayP99Ms:   millis(percentile(lr.toRelay, 0.99)),
		FromRelayP50Ms: millis(percentile(lr.fromRelay, 0.50)),
		FromRelayP99Ms: millis(percentile(lr.fromRelay, 0.99)),
	}
	if lr.writing > 0 && r.Lines > 1 {
		// The lines after the first are appended over lr.writing.
		r.AchievedRate = math.Round(float64(r.Lines-1) / lr.writing.Seconds())
	}
	if sync != nil && sync.P99Ms > 0 {
		r.P99OverFdatasync = round1(r.P99Ms / sync.P99Ms)
	}
	return r
}

// percentile is the q-quantile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// millis is d in milliseconds, to the microsecond.
func millis(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }
