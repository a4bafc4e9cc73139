package recording

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// ReplayConfig configures Replay.
type ReplayConfig struct {
	// Set is the recordings to replay, in order (see Scan).
	Set *Set
	// Store is the database to replay into: it must stand where the set
	// starts (the first recording's snapshot restored, or the database a
	// replay of the recordings before left).
	Store *outbox.Store
	// Processor applies the items; ProcessorName names it (the recorded
	// one, or another to compare).
	Processor     ingest.Processor
	ProcessorName string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// KeepPlaces keeps the place of every delivery applied or
	// dead-lettered in Summary.Places, for Diff: 40 bytes each.
	KeepPlaces bool
}

// Summary is what a replay did.
type Summary struct {
	Feed       string `json:"feed"`
	Processor  string `json:"processor"`
	Recordings int    `json:"recordings"`
	// Items counts the items delivered (requeues included), and the
	// others what came of them in the replay.
	Items          int64 `json:"items"`
	Applied        int64 `json:"applied"`
	ReplaysSkipped int64 `json:"replaysSkipped"`
	DeadLettered   int64 `json:"deadLettered"`
	Requeued       int64 `json:"requeued"`
	// Retried counts tries that failed transiently in the replay.
	Retried int64 `json:"retried"`
	// Skipped counts items a completion failure skipped in the recorded
	// run, skipped again (their loss recorded again).
	Skipped int64 `json:"skipped"`
	// EpochChanges counts the epochs the recordings started (a new
	// feed's first included), Losses the losses recorded.
	EpochChanges int64 `json:"epochChanges"`
	Losses       int64 `json:"losses"`
	Outputs      int64 `json:"outputs"`
	// DecisionsDiffering counts the items whose outcome (applied, or
	// dead-lettered for which reason) is not the recorded one;
	// FirstDiffering is the first of them.
	DecisionsDiffering int64     `json:"decisionsDiffering"`
	FirstDiffering     *Decision `json:"firstDiffering"`
	// Unconfirmed lists transactions left unconfirmed at the end of the
	// last recording, not replayed; Torn the recordings whose tail could
	// not be read.
	Unconfirmed []TailReport `json:"unconfirmed"`
	Torn        []TailReport `json:"torn"`
	Seconds     float64      `json:"seconds"`
	PerSecond   float64      `json:"itemsPerSecond"`
	// Places are the deliveries the replay applied or dead-lettered, in
	// order, for Diff (with ReplayConfig.KeepPlaces).
	Places []Place `json:"-"`
}

// Decision is an item whose outcome in the replay is not the recorded one.
type Decision struct {
	Sequence  int64  `json:"sequence"`
	Partition int32  `json:"partition"`
	Epoch     string `json:"epoch"`
	Position  int64  `json:"position"`
	Recorded  string `json:"recorded"`
	Replayed  string `json:"replayed"`
}

// TailReport is a recording's tail, as a replay reports it.
type TailReport struct {
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	Bytes  int64  `json:"bytes"`
	Why    string `json:"why"`
}

// Place is a delivery's place, and its rank in the replay.
type Place struct {
	Partition int32
	Epoch     string
	Position  int64
	Ordinal   int64
}

// Replay runs the set's recorded deliveries through a real ingest loop on
// cfg.Store, with no feed and no relay: each item with its recorded
// sequence and attempt, the recorded epoch changes and losses, the
// recorded requeues, transaction by transaction as recorded; the loop's
// guard, savepoints, retries and dead letters apply as in the recorded
// run (the retry delays are short: a replay waits for nothing). A
// transaction left unconfirmed at the end of the last recording is not
// replayed (see Summary.Unconfirmed).
//
// It fails when the database does not stand where the set starts, when
// the loop fails or stalls (a commit that keeps failing), or when ctx ends.
func Replay(ctx context.Context, cfg ReplayConfig) (Summary, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	h := cfg.Set.Header()
	sum := Summary{Feed: h.Feed, Processor: cfg.ProcessorName, Recordings: len(cfg.Set.Files)}
	sum.reportTails(cfg.Set)
	before, err := cfg.Store.LastOutboxID(ctx)
	if err != nil {
		return sum, err
	}
	t := &tally{sum: &sum, keepPlaces: cfg.KeepPlaces}
	feed := newReplayFeed(cfg.Set, t)
	lc := replayLoopConfig(h, cfg.ProcessorName, log)
	lc.Recorder = t
	loop, err := ingest.NewLoop(cfg.Store, feed, cfg.Processor, lc)
	if err != nil {
		return sum, err
	}
	feed.requeue = loop.RequeueWith
	feed.store = cfg.Store
	started := time.Now()
	if err := runUntilDone(ctx, loop, feed); err != nil {
		return sum, err
	}
	sum.Seconds = time.Since(started).Seconds()
	if sum.Seconds > 0 {
		sum.PerSecond = float64(sum.Items) / sum.Seconds
	}
	after, err := cfg.Store.LastOutboxID(ctx)
	if err != nil {
		return sum, err
	}
	sum.Outputs = after - before
	return sum, nil
}

func (s *Summary) reportTails(set *Set) {
	for i, f := range set.Files {
		t := f.Tail
		if t.Unconfirmed != nil && !f.Confirmed && i == len(set.Files)-1 {
			s.Unconfirmed = append(s.Unconfirmed, TailReport{File: f.Path, Offset: t.Unconfirmed.Offset,
				Bytes: t.Bytes, Why: fmt.Sprintf("transaction %d was being committed when the recording stopped: "+
					"the next recording of the feed tells whether it committed", t.Unconfirmed.Number)})
		}
		if t.Torn == "" {
			continue
		}
		why := t.Torn + "; nothing in them was committed"
		switch u := t.Unconfirmed; {
		case u != nil && f.Confirmed:
			why = fmt.Sprintf("%s: the commit record of transaction %d, which committed (the next recording starts after it): it is replayed",
				t.Torn, u.Number)
		case u != nil:
			why = fmt.Sprintf("%s: the commit record of transaction %d", t.Torn, u.Number)
		}
		s.Torn = append(s.Torn, TailReport{File: f.Path, Offset: t.TornOffset, Bytes: t.Offset + t.Bytes - t.TornOffset, Why: why})
	}
}

// replayLoopConfig is the recorded loop's configuration, with waits cut
// short: a replay waits for nothing.
func replayLoopConfig(h Header, processor string, log *slog.Logger) ingest.Config {
	lc := ingest.DefaultConfig(h.Feed)
	lc.Processor = processor
	s := h.Loop
	if s.BatchMax > 0 {
		lc.BatchMax = s.BatchMax
	}
	if s.BatchBytes > 0 {
		lc.BatchBytes = s.BatchBytes
	}
	lc.BatchWait = 0 // a batch is what the feed hands over at once: a recorded transaction
	if s.RetryAttempts > 0 {
		lc.Retry.Attempts = s.RetryAttempts
	}
	if d, err := time.ParseDuration(s.AttemptTimeout); err == nil {
		lc.Retry.AttemptTimeout = d
	}
	lc.Retry.MinDelay, lc.Retry.MaxDelay = time.Millisecond, 10*time.Millisecond
	lc.CommitRetry.MinDelay, lc.CommitRetry.MaxDelay = time.Millisecond, 10*time.Millisecond
	if s.OnFailure != "" {
		lc.OnFailure = s.OnFailure
	}
	if s.OnCompletionFailure != "" {
		lc.OnCompletionFailure = s.OnCompletionFailure
	}
	if s.MaxMessageBytes > 0 {
		lc.MaxMessageBytes = s.MaxMessageBytes
	}
	lc.DeadLetterTopic = s.DeadLetterTopic
	lc.StallMaxDelay = 100 * time.Millisecond
	lc.Logger = log
	return lc
}

// runUntilDone runs the loop until the feed has handed over everything
// and the loop has committed it, or the loop fails or stalls.
func runUntilDone(ctx context.Context, loop *ingest.Loop, feed *replayFeed) error {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- loop.Run(rctx) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-feed.done:
			stop()
			if err := <-errc; err != nil {
				return err
			}
			return feed.err
		case err := <-errc:
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("replay of %s: %w", loop.Name(), err)
		case <-tick.C:
			if st, why := loop.State(); st == outbox.StateStalled {
				stop()
				<-errc
				return fmt.Errorf("replay of %s stalled: %s", loop.Name(), why)
			}
		}
	}
}

// replayFeed is a Feed of recorded transactions: each Poll with nothing
// in hand yields one transaction's records (or its first max), so the
// loop's transactions are the recorded ones.
type replayFeed struct {
	set     *Set
	t       *tally
	requeue func(ctx context.Context, id int64, r outbox.Requeue) (bool, error)
	store   *outbox.Store

	file  int     // the next file to open
	rd    *Reader // the file being read
	queue []step  // of the transaction being handed over
	ends  ends

	done     chan struct{}
	finished bool
	err      error
}

// step is one thing to hand over: a record with its recorded outcome, or
// a recorded requeue.
type step struct {
	rec     ingest.Record
	want    ingest.Outcome
	requeue *Entry
}

var (
	_ ingest.Feed      = (*replayFeed)(nil)
	_ ingest.ItemSizer = (*replayFeed)(nil)
)

func newReplayFeed(set *Set, t *tally) *replayFeed {
	return &replayFeed{set: set, t: t, done: make(chan struct{}), ends: ends{m: map[int32]int64{}}}
}

func (f *replayFeed) Kind() string      { return f.set.Header().Kind }
func (f *replayFeed) Source() string    { return f.set.Header().Source }
func (f *replayFeed) MaxItemBytes() int { return f.set.MaxItemBytes }

// Ends is the position of the last record handed over, per partition.
func (f *replayFeed) Ends() map[int32]int64 { return f.ends.get() }

// Commit has nothing to tell a recording.
func (f *replayFeed) Commit(context.Context, []outbox.Checkpoint) error { return nil }

// Open checks the database stands where the recordings start.
func (f *replayFeed) Open(_ context.Context, from map[int32]outbox.Checkpoint) error {
	if want := f.set.From(); !sameCheckpoints(from, want) {
		return fmt.Errorf("%w: the database stands at %s, but %s starts at %s: restore the recording's snapshot, "+
			"or replay the recordings before it first", ErrBadSet, describeCheckpoints(from), f.set.Files[0].Path, describeCheckpoints(want))
	}
	return nil
}

// Close closes the file being read.
func (f *replayFeed) Close() error {
	if f.rd != nil {
		return f.rd.Close()
	}
	return nil
}

// Poll hands over the next transaction's records. With records already in
// hand it returns at once, so recorded transactions stay apart. A
// recorded requeue is made here, when nothing is in hand: everything
// before it has been committed.
func (f *replayFeed) Poll(ctx context.Context, buf []ingest.Record, limit int) ([]ingest.Record, error) {
	if len(buf) > 0 {
		return buf, nil
	}
	for len(f.queue) == 0 || f.queue[0].requeue != nil {
		if len(f.queue) > 0 {
			if err := f.doRequeue(ctx, f.queue[0].requeue); err != nil {
				f.finish(err)
			}
			f.queue = f.queue[1:]
			continue
		}
		if f.finished || !f.nextTxn() {
			f.finish(nil)
			<-ctx.Done()
			return buf, ctx.Err()
		}
	}
	for len(f.queue) > 0 && len(buf) < limit && f.queue[0].requeue == nil {
		st := f.queue[0]
		f.queue = f.queue[1:]
		r := st.rec
		buf = append(buf, r)
		if r.Kind != ingest.RecordLoss {
			f.ends.set(r.Partition, r.Position)
		}
		if r.Kind == ingest.RecordItem {
			f.t.expect(r.Replayed.Sequence, r, st.want)
		} else {
			break // an epoch change or a loss ends the loop's batch: hand it over last
		}
	}
	return buf, nil
}

// finish says the feed has nothing more, err (if any) why.
func (f *replayFeed) finish(err error) {
	if f.finished {
		return
	}
	f.finished, f.err = true, err
	close(f.done)
}

// doRequeue applies the dead letter a recorded requeue applied.
func (f *replayFeed) doRequeue(ctx context.Context, e *Entry) error {
	d := e.Delivery
	id, err := f.store.DeadLetterAt(ctx, d.Feed, d.Partition, d.Epoch, d.Position)
	if err != nil {
		return fmt.Errorf("replay the requeue of sequence %d: %w", d.Sequence, err)
	}
	f.t.expect(d.Sequence, e.Record, e.Outcome)
	ok, err := f.requeue(ctx, id, outbox.Requeue{Payload: e.Record.Item.Value}) // an edited requeue's payload
	switch {
	case err != nil:
		f.t.notCommitted("requeue failed: " + err.Error())
	case !ok:
		f.t.notCommitted("requeued already")
	}
	return nil
}

// nextTxn queues the next transaction's steps; false at the end.
func (f *replayFeed) nextTxn() bool {
	for {
		if f.rd == nil && !f.openNext() {
			return false
		}
		txn, err := f.rd.Next()
		if errors.Is(err, io.EOF) {
			file := f.set.Files[f.file-1]
			f.rd.Close()
			f.rd = nil
			if file.Confirmed {
				f.queueTxn(*file.Tail.Unconfirmed)
				return true
			}
			continue
		}
		if err != nil {
			f.finish(err)
			return false
		}
		if f.queueTxn(txn) {
			return true
		}
	}
}

func (f *replayFeed) openNext() bool {
	if f.file >= len(f.set.Files) {
		return false
	}
	rd, err := Open(f.set.Files[f.file].Path)
	if err != nil {
		f.finish(err)
		return false
	}
	f.rd = rd
	f.file++
	return true
}

// queueTxn queues a transaction's steps; false when it has none (only
// failed tries).
func (f *replayFeed) queueTxn(txn Txn) bool {
	for i := range txn.Entries {
		e := &txn.Entries[i]
		if e.Record.Kind != ingest.RecordItem {
			f.queue = append(f.queue, step{rec: e.Record})
			continue
		}
		switch e.Outcome.Result {
		case ingest.ResultRetried:
			// A try, not what came of the item: its last try follows.
		case ingest.ResultRequeued:
			f.queue = append(f.queue, step{requeue: e})
		case ingest.ResultSkipped:
			// Moved past without its effects: the position moves, the
			// loss follows in the same transaction.
			f.t.sum.Skipped++
			f.queue = append(f.queue, step{rec: ingest.Record{Kind: ingest.RecordEpoch, Partition: e.Record.Partition,
				Epoch: e.Record.Epoch, Position: e.Record.Position}})
		default:
			f.queue = append(f.queue, step{rec: replayedRecord(e), want: e.Outcome})
		}
	}
	return len(f.queue) > 0
}

// replayedRecord is the item of e with its recorded delivery.
func replayedRecord(e *Entry) ingest.Record {
	r := e.Record
	rp := &ingest.Replayed{Sequence: e.Delivery.Sequence, Attempt: e.Delivery.Attempt}
	if e.Outcome.Result == ingest.ResultSpent {
		rp.SpentReason, rp.SpentError = e.Outcome.Reason, e.Outcome.Error
	}
	r.Replayed = rp
	return r
}

// OpenTarget opens the database a replay of set goes into, at path out:
// the database there when there is one and a replay made it (a replay of
// the recordings before set left it); else a copy of the database at from
// when from is not "" (a copy of the live database the user kept, or the
// live one: it is only read); else a copy of the first recording's
// snapshot; else a new database. It marks it as a replay copy, so no
// server ever claims it (see outbox.ErrReplayCopy). restored names what
// was copied ("" when nothing was). It refuses an existing database a
// replay did not make (ErrNotReplayCopy), and from with an existing out.
func OpenTarget(ctx context.Context, set *Set, out, from string) (s *outbox.Store, restored string, err error) {
	f := set.Files[0]
	note := "replay of feed " + f.Header.Feed + " from " + filepath.Base(f.Path)
	_, serr := os.Stat(out)
	switch {
	case serr == nil && from != "":
		return nil, "", fmt.Errorf("%s exists: a replay starts from a copy of %s only into a new database", out, from)
	case serr == nil:
		if err := checkReplayCopy(ctx, out); err != nil {
			return nil, "", err
		}
	case !errors.Is(serr, os.ErrNotExist):
		return nil, "", serr
	case from != "":
		if err := outbox.CopyDatabase(ctx, from, out, note); err != nil {
			return nil, "", err
		}
		restored = from
	case f.Header.Snapshot != "":
		if f.Header.Part != 1 {
			return nil, "", fmt.Errorf("%w: %s is part %d of its run: replay its part 1 first", ErrBadSet, f.Path, f.Header.Part)
		}
		if r := f.Header.SnapshotRun; r != "" && r != f.Header.Run {
			return nil, "", fmt.Errorf("%w: %s records from the snapshot %s, taken at the start of run %s: "+
				"replay from that run's recordings (give their directory)", ErrBadSet, f.Path, f.Header.Snapshot, r)
		}
		snap := filepath.Join(filepath.Dir(f.Path), f.Header.Snapshot)
		if err := copyFile(snap, out); err != nil {
			return nil, "", fmt.Errorf("restore the snapshot %s: %w", snap, err)
		}
		restored = snap
	}
	s, err = outbox.Open(ctx, outbox.DefaultConfig(out))
	if err != nil {
		return nil, "", err
	}
	if err := s.MarkReplayCopy(ctx, note); err != nil {
		s.Close()
		return nil, "", err
	}
	return s, restored, nil
}

// ErrNotReplayCopy: the database a replay was to write into exists and
// was not made by a replay: a replay never writes into a live database.
var ErrNotReplayCopy = errors.New("not a database a replay made")

// checkReplayCopy refuses an existing database at path that is not a
// replay copy.
func checkReplayCopy(ctx context.Context, path string) error {
	s, err := outbox.OpenExisting(ctx, path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer s.Close()
	if _, ok, err := s.ReplayCopy(ctx); err != nil || !ok {
		return cmp.Or(err, fmt.Errorf("%s: %w (a server's, or another program's): a replay writes only into a new "+
			"database or one a replay made", path, ErrNotReplayCopy))
	}
	return nil
}

// copyFile copies src to dst, which appears whole or not at all.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if serr := out.Sync(); err == nil {
		err = serr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
