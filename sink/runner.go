package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/outbox"
)

// Store is what a Runner needs of the outbox store; *outbox.Store is one.
type Store interface {
	RelayRows(ctx context.Context, after int64, limit int) ([]outbox.Row, error)
	LastOutboxID(ctx context.Context) (int64, error)
	SinkProgress(ctx context.Context, name string) (int64, error)
	SetSinkProgress(ctx context.Context, name string, lastID int64) error
	DeadLetterRows(ctx context.Context, dls []outbox.RowDeadLetter) (int, error)
	Commits() <-chan struct{}
	PendingAfter(ctx context.Context, after int64) (outbox.Pending, error)
}

var _ Store = (*outbox.Store)(nil)

// Screener is a Target that can tell, before it delivers rows, which of
// them it refuses for good (too large, not of the shape its mapping
// needs). The runner stores those as dead letters before it delivers the
// others, so a refusal is never lost, even to a crash right after the
// delivery. An exactly-once target whose Resume may pass a refused row
// should be one: a refusal Deliver returns is stored after the rows
// around it are durable, and a crash in between loses the dead letter
// when Resume then goes past it.
type Screener interface {
	Screen(rows []outbox.Row) (keep []outbox.Row, refused []outbox.RowDeadLetter)
}

// Config tunes a Runner. Zero fields take the defaults.
type Config struct {
	// Batch is the most rows per Deliver (default 1000).
	Batch int
	// MinBackoff and MaxBackoff bound the wait after a failed attempt,
	// doubling from the one to the other (defaults 100ms and 30s).
	MinBackoff, MaxBackoff time.Duration
	// ProgressEvery spaces the progress stored for rows the sink passes
	// over (none of its topics): pruning waits for it (default 1s). Rows
	// delivered store it at once.
	ProgressEvery time.Duration
	// Poll is the longest an idle runner waits without a commit's signal
	// before it reads again (default 1s).
	Poll time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Batch <= 0 {
		c.Batch = 1000
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = time.Second
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// ErrBackInTime is the error of a target that holds outbox ids the
// database never had: the database is older than the target (a restored
// backup, another database). The runner delivers nothing until an
// operator looks, and asks again at the longest backoff.
var ErrBackInTime = errors.New("the target holds outbox ids the database never had")

// Runner relays a store's outbox to one sink's target: it reads the rows
// after the sink's progress, keeps those of the sink's topics, delivers
// them, stores the refused ones as dead letters and then the progress.
// Run does the work; Status may be called from any goroutine.
type Runner struct {
	spec   Spec
	target Target
	store  Store
	cfg    Config
	log    *slog.Logger
	st     tracker

	running atomic.Bool
	close   sync.Once

	// Only the Run goroutine touches these.
	stored   int64     // the progress stored
	storedAt time.Time // when it was stored
	// unsure are the ids of a failed Deliver's rows: the next Resume
	// tells how many of them the target holds, to count them delivered.
	unsure []int64
}

// NewRunner makes the runner of the sink spec, delivering to target.
func NewRunner(store Store, spec Spec, target Target, cfg Config) (*Runner, error) {
	if store == nil || target == nil {
		return nil, errors.New("sink runner: a store and a target are required")
	}
	if !ValidName(spec.Name) {
		return nil, fmt.Errorf("sink runner: bad sink name %q", spec.Name)
	}
	log := spec.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "sink", "sink", spec.Name)
	r := &Runner{spec: spec, target: target, store: store, cfg: cfg.withDefaults(), log: log}
	r.st.s = Status{Name: spec.Name, State: StateStopped}
	if spec.URL != nil {
		r.st.s.Kind, r.st.s.URL = spec.URL.Scheme, spec.URL.Redacted()
	}
	for t := range spec.Topics {
		r.st.s.Topics = append(r.st.s.Topics, t)
	}
	sort.Strings(r.st.s.Topics)
	return r, nil
}

// Name is the sink's name.
func (r *Runner) Name() string { return r.spec.Name }

// Status returns a snapshot of the sink. Safe for concurrent use.
func (r *Runner) Status() Status { return r.st.snapshot() }

// Close closes the target, once (later calls return nil). Call it after
// Run returned.
func (r *Runner) Close() error {
	var err error
	r.close.Do(func() { err = r.target.Close() })
	return err
}

// Run delivers until ctx is done and returns nil then. A failure (the
// target unreachable, a store error) ends the attempt: the runner waits,
// with capped exponential backoff, asks the target again where it is
// (Resume) and goes on from there. It must not be called concurrently.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("sink runner: Run is already running")
	}
	defer r.running.Store(false)
	bo := &backoff.ExponentialBackOff{
		InitialInterval: r.cfg.MinBackoff, RandomizationFactor: 0.2,
		Multiplier: 2, MaxInterval: r.cfg.MaxBackoff,
	}
	bo.Reset()
	for {
		progressed, err := r.session(ctx)
		if ctx.Err() != nil {
			r.st.state(StateStopped)
			return nil
		}
		if progressed {
			bo.Reset()
		}
		wait, state := bo.NextBackOff(), StateBackingOff
		if errors.Is(err, ErrBackInTime) {
			wait, state = r.cfg.MaxBackoff, StateRefusing
			r.log.Error("refusing to deliver", "err", err)
		} else {
			r.log.Warn("delivering failed; starting over", "err", err, "retry_in", wait)
		}
		r.st.failed(state, err, r.cfg.Now())
		if clock.Sleep(ctx, wait) != nil {
			r.st.state(StateStopped)
			return nil
		}
	}
}

// session resumes and delivers until an error or ctx ends it; progressed
// says whether it delivered or passed over any row.
func (r *Runner) session(ctx context.Context) (progressed bool, err error) {
	r.st.state(StateStarting)
	pos, err := r.resume(ctx)
	if err != nil {
		return false, err
	}
	for ctx.Err() == nil {
		wake := r.store.Commits() // before the read: a commit after it wakes us
		rows, err := r.store.RelayRows(ctx, pos, r.cfg.Batch)
		if err != nil {
			return progressed, err
		}
		if len(rows) == 0 {
			if err := r.storeProgress(ctx, pos, true); err != nil {
				return progressed, err
			}
			r.lag(ctx, pos, StateIdle)
			select {
			case <-ctx.Done():
			case <-wake:
			case <-time.After(r.cfg.Poll):
			}
			continue
		}
		if gap := rows[0].ID - pos - 1; gap > 0 {
			// Committed ids have no gaps: these were pruned before the sink
			// read them (a sink added, or one removed from the configuration
			// and added again, after its rows went).
			r.log.Error("outbox rows were pruned before this sink took them", "from", pos+1, "to", rows[0].ID-1, "rows", gap)
			r.st.update(func(s *Status) { s.Missed += gap })
		}
		end := rows[len(rows)-1].ID
		mine := r.mine(rows)
		if len(mine) > 0 {
			r.st.state(StateDelivering)
			if err := r.deliver(ctx, mine); err != nil {
				return progressed, err
			}
		}
		progressed, pos = true, end
		if err := r.storeProgress(ctx, pos, len(mine) > 0); err != nil {
			return progressed, err
		}
		r.lag(ctx, pos, StateDelivering)
	}
	return progressed, ctx.Err()
}

// resume returns where delivery goes on: after the larger of the stored
// progress and what the target holds.
func (r *Runner) resume(ctx context.Context) (int64, error) {
	stored, err := r.store.SinkProgress(ctx, r.spec.Name)
	if err != nil {
		return 0, err
	}
	held, err := r.target.Resume(ctx)
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	if held > stored {
		last, err := r.store.LastOutboxID(ctx)
		if err != nil {
			return 0, err
		}
		if held > last {
			return 0, fmt.Errorf("%w: it holds id %d, the database's last is %d", ErrBackInTime, held, last)
		}
	}
	r.stored, r.storedAt = stored, r.cfg.Now()
	pos := max(stored, held)
	if err := r.storeProgress(ctx, pos, true); err != nil { // the target holds them
		return 0, err
	}
	landed := 0
	for _, id := range r.unsure {
		if id <= held {
			landed++
		}
	}
	r.unsure = r.unsure[:0]
	r.st.update(func(s *Status) {
		s.Delivered = pos
		s.DeliveredTotal += int64(landed)
	})
	r.log.Debug("resuming", "stored", stored, "target_holds", held)
	return pos, nil
}

// mine is the rows of the sink's topics.
func (r *Runner) mine(rows []outbox.Row) []outbox.Row {
	if len(r.spec.Topics) == 0 {
		return rows
	}
	out := rows[:0:0]
	for _, row := range rows {
		if r.spec.Takes(row.Topic) {
			out = append(out, row)
		}
	}
	return out
}

// deliver delivers rows, storing as dead letters those the target
// refuses: before the delivery those a Screener finds, after it those
// Deliver returns.
func (r *Runner) deliver(ctx context.Context, rows []outbox.Row) error {
	var dead int
	if sc, ok := r.target.(Screener); ok {
		keep, refused := sc.Screen(rows)
		if err := r.storeDead(ctx, refused); err != nil {
			return err
		}
		rows, dead = keep, len(refused)
	}
	var dls []outbox.RowDeadLetter
	if len(rows) > 0 {
		var err error
		if dls, err = r.target.Deliver(ctx, rows); err != nil {
			for _, row := range rows {
				r.unsure = append(r.unsure, row.ID)
			}
			return fmt.Errorf("deliver %d rows (ids %d to %d): %w", len(rows), rows[0].ID, rows[len(rows)-1].ID, err)
		}
		if err := r.storeDead(ctx, dls); err != nil {
			return err
		}
	}
	now := r.cfg.Now()
	r.st.update(func(s *Status) {
		s.DeliveredTotal += int64(len(rows) - len(dls))
		s.DeadLettered += int64(dead + len(dls))
		s.LastDeliveryAt, s.LastError, s.LastErrorAt = now, "", time.Time{}
	})
	return nil
}

// storeDead stores dead letters; rows after them may be durable in the
// target already, so a failure is tried again (with backoff) rather than
// starting over, until it succeeds or ctx is done.
func (r *Runner) storeDead(ctx context.Context, dls []outbox.RowDeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	wait := r.cfg.MinBackoff
	for {
		_, err := r.store.DeadLetterRows(ctx, dls)
		if err == nil {
			for _, d := range dls {
				r.log.Warn("the target refused a row: stored as a dead letter",
					"outbox_id", d.Row.ID, "topic", d.Row.Topic, "reason", d.Reason, "error", d.Error)
			}
			return nil
		}
		r.st.failed(StateBackingOff, err, r.cfg.Now())
		r.log.Warn("storing dead letters failed; trying again", "err", err, "retry_in", wait)
		if clock.Sleep(ctx, wait) != nil {
			return fmt.Errorf("store dead letters: %w", err)
		}
		wait = min(2*wait, r.cfg.MaxBackoff)
	}
}

// storeProgress stores pos as the sink's progress: at once when now, else
// when ProgressEvery passed since the last time.
func (r *Runner) storeProgress(ctx context.Context, pos int64, now bool) error {
	if pos <= r.stored || (!now && r.cfg.Now().Sub(r.storedAt) < r.cfg.ProgressEvery) {
		return nil
	}
	if err := r.store.SetSinkProgress(ctx, r.spec.Name, pos); err != nil {
		return err
	}
	r.stored, r.storedAt = pos, r.cfg.Now()
	r.st.update(func(s *Status) { s.Stored = pos })
	return nil
}

// lag records that every row up to pos is delivered, the lag after it,
// and the state; an idle sink's last error is over.
func (r *Runner) lag(ctx context.Context, pos int64, state string) {
	p, err := r.store.PendingAfter(ctx, pos)
	r.st.update(func(s *Status) {
		s.State, s.Delivered = state, pos
		if err == nil {
			s.LagRows, s.LagBytes = p.Rows, p.Bytes
		}
		if state == StateIdle {
			s.LastError, s.LastErrorAt = "", time.Time{}
		}
	})
}
