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

	"github.com/twmb/franz-go/pkg/kgo"
)

// latencyRun is what the latency phase's writer and consumer share: each
// line's position and append time. The writer stores a line's time before
// the write that appends it; the consumer reads it when the line's output
// arrives.
type latencyRun struct {
	names     []string
	positions []int64        // each line's position, ascending
	appended  []atomic.Int64 // each line's append time, unix nanoseconds

	// The consumer's alone until it stops.
	seen      bitset // by line index
	latencies []time.Duration
	stats     checkStats

	mu       sync.Mutex
	distinct int64
	complete chan struct{} // closed once every line's output was seen
}

// newLatencyRun prepares n lines.
func newLatencyRun(names []string, n int64) *latencyRun {
	lr := &latencyRun{names: names, positions: make([]int64, n), appended: make([]atomic.Int64, n),
		seen: newBitset(n), latencies: make([]time.Duration, 0, n), complete: make(chan struct{})}
	g := newLedgerGen(names)
	for i := range lr.positions {
		l, _ := g.next()
		lr.positions[i] = l.Position
	}
	return lr
}

// runLatency measures, at a fixed offered load (--rate lines/s for
// --latency-duration), the time from a line's append to the file to its
// output being visible to a read_committed consumer, ingest and relay
// running on a fresh database.
func (b *bench) runLatency(ctx context.Context) error {
	n := b.o.latencyLines()
	if n == 0 {
		return nil
	}
	topic, path := b.topic("latency"), b.path("latency.csv")
	if err := b.createTopics(ctx, topic); err != nil {
		return err
	}
	defer b.doneWithTopic(topic)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return fmt.Errorf("create latency file: %w", err)
	}
	e, err := b.openEngine(ctx, "latency")
	if err != nil {
		return err
	}
	defer e.close()
	lr := newLatencyRun(b.data.Names, n)
	if err := b.measureLatency(ctx, e, lr, path, topic); err != nil {
		return err
	}
	b.res.Latency = lr.result(b.o)
	b.res.Verify.LatencyDuplicates = lr.stats.duplicates
	if lr.stats.duplicates > 0 || lr.stats.foreign > 0 {
		b.res.Verify.fail("latency: %d duplicate outputs, %d outputs of no line", lr.stats.duplicates, lr.stats.foreign)
	}
	return nil
}

// measureLatency runs the engine and a consumer while the writer appends,
// until every line's output has been seen.
func (b *bench) measureLatency(ctx context.Context, e *benchEngine, lr *latencyRun, path, topic string) error {
	cons, err := b.startConsumer(ctx, topic, e.failed, lr.add)
	if err != nil {
		return err
	}
	loop, err := e.startLoop(ctx, path, topic)
	if err != nil {
		cons.stop()
		return err
	}
	r, rt, err := e.startRelay(ctx)
	if err == nil {
		err = e.waitConnected(ctx, r)
	}
	if err == nil {
		err = lr.write(ctx, path, b.o.Rate)
	}
	if err == nil {
		err = waitFor(ctx, e.failed, lr.complete, time.Second, lr.isComplete)
	}
	if serr := stopAll(loop, rt, cons); err == nil {
		err = serr
	}
	return err
}

// write appends the lines at rate lines/s: each line when it is due, those
// that fell due together in one write.
func (lr *latencyRun) write(ctx context.Context, path string, rate int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open latency file: %w", err)
	}
	defer f.Close()
	g, n := newLedgerGen(lr.names), int64(len(lr.positions))
	buf := make([]byte, 0, 64<<10)
	start := time.Now()
	for i := int64(0); i < n; {
		if err := ctx.Err(); err != nil {
			return err
		}
		due := min(n, int64(time.Since(start).Seconds()*float64(rate))+1)
		if due <= i {
			time.Sleep(time.Until(start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))))
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
func (lr *latencyRun) add(r *kgo.Record, at time.Time) {
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
	lr.latencies = append(lr.latencies, at.Sub(time.Unix(0, lr.appended[i].Load())))
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.distinct++; lr.distinct == int64(len(lr.positions)) {
		close(lr.complete)
	}
}

// isComplete reports whether every line's output was seen.
func (lr *latencyRun) isComplete() (bool, error) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.distinct >= int64(len(lr.positions)), nil
}

// result is the latency percentiles. Call it once the consumer has stopped.
func (lr *latencyRun) result(o benchOptions) *latencyResult {
	slices.Sort(lr.latencies)
	return &latencyResult{
		Rate: o.Rate, Seconds: o.LatencyDuration.Seconds(), Lines: int64(len(lr.latencies)),
		P50Ms: millis(percentile(lr.latencies, 0.50)),
		P99Ms: millis(percentile(lr.latencies, 0.99)),
		MaxMs: millis(percentile(lr.latencies, 1)),
	}
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
