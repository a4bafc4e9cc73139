package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Feed states, as Feed.State reports them. A feed known only from the
// database (no longer configured) is StateStopped.
const (
	StateRunning  = "running"
	StateCaughtUp = "caught-up"
	StateStalled  = "stalled"
	StateStopped  = "stopped"
)

// FeedStatus is the body of GET /feeds/{name}/status.
type FeedStatus struct {
	Feed      string `json:"feed"`
	Kind      string `json:"kind"`
	Source    string `json:"source"`
	Processor string `json:"processor"`
	State     string `json:"state"`
	// Configured is false for a feed known only from the database.
	Configured bool `json:"configured"`
	// Epoch is the only partition's epoch ("" with several partitions or
	// none: see Partitions). Position, End and Lag are summed over the
	// partitions; Lag counts bytes (file) or records (Kafka) not yet applied.
	Epoch      string            `json:"epoch"`
	Position   int64             `json:"position"`
	End        int64             `json:"end"`
	Lag        int64             `json:"lag"`
	Partitions []PartitionStatus `json:"partitions"`

	Applied            int64 `json:"applied"`
	ReplaysSkipped     int64 `json:"replaysSkipped"`
	Retries            int64 `json:"retries"`
	DeadLettered       int64 `json:"deadLettered"`
	CompletionFailures int64 `json:"completionFailures"`
	EpochChanges       int64 `json:"epochChanges"`

	Lossless bool         `json:"lossless"`
	Losses   []LossStatus `json:"losses"`

	LastError     string     `json:"lastError"`
	LastAppliedAt *time.Time `json:"lastAppliedAt"`

	Outbox Backlog `json:"outbox"`
}

// PartitionStatus is where one partition of a feed stands.
type PartitionStatus struct {
	Partition int32  `json:"partition"`
	Epoch     string `json:"epoch"`
	Position  int64  `json:"position"`
	End       int64  `json:"end"`
	Lag       int64  `json:"lag"`
}

// LossStatus is one loss of a feed: input it moved past without keeping its
// effects. Acknowledged losses stay listed, with AckedAt set.
type LossStatus struct {
	At        time.Time  `json:"at"`
	Reason    string     `json:"reason"`
	Partition int32      `json:"partition"`
	Epoch     string     `json:"epoch"`
	From      int64      `json:"from"`
	To        int64      `json:"to"`
	AckedAt   *time.Time `json:"ackedAt"`
}

// Backlog is how many outbox rows wait to be published and how long the
// oldest has waited, in seconds (0 when none waits).
type Backlog struct {
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldestPendingAge"`
}

// feedNames returns the configured feeds and those known only from the
// database, by name.
func (s *Server) feedNames(ctx context.Context) ([]string, error) {
	stored, err := s.store.Feeds(ctx)
	if err != nil {
		return nil, err
	}
	names := slices.Collect(maps.Keys(s.feeds))
	for _, f := range stored {
		if _, ok := s.feeds[f.Name]; !ok {
			names = append(names, f.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// feedStatus reads one feed's status. published is the last outbox id
// known published. It returns an error wrapping outbox.ErrNotFound for a
// feed neither configured nor stored.
func (s *Server) feedStatus(ctx context.Context, name string, published int64) (FeedStatus, error) {
	f := s.feeds[name]
	st, err := s.store.Feed(ctx, name)
	switch {
	case errors.Is(err, outbox.ErrNotFound) && f != nil:
		st = outbox.FeedStats{Lossless: true} // configured, not yet registered
	case err != nil:
		return FeedStatus{}, err
	}
	cps, err := s.store.ReadPositions(ctx, name)
	if err != nil {
		return FeedStatus{}, err
	}
	losses, err := s.store.Losses(ctx, name)
	if err != nil {
		return FeedStatus{}, err
	}
	b, err := s.backlog(ctx, name, published)
	if err != nil {
		return FeedStatus{}, err
	}
	fs := newFeedStatus(name, st, f)
	fs.setPartitions(cps, f)
	fs.Losses = lossStatuses(losses)
	fs.Outbox = b
	return fs, nil
}

// newFeedStatus fills the description, state and counters. A configured
// feed describes itself; a stored one is described by the database.
func newFeedStatus(name string, st outbox.FeedStats, f Feed) FeedStatus {
	fs := FeedStatus{
		Feed: name, Kind: st.Kind, Source: st.Source, Processor: st.Processor, State: StateStopped,
		Applied: st.Applied, ReplaysSkipped: st.ReplaysSkipped, Retries: st.Retries,
		DeadLettered: st.DeadLettered, CompletionFailures: st.CompletionFailures,
		EpochChanges: st.EpochChanges, Lossless: st.Lossless, LastError: st.LastError,
		LastAppliedAt: unixTime(st.LastAppliedAt),
	}
	if f != nil {
		fs.Configured = true
		fs.Kind, fs.Source, fs.Processor = f.Kind(), f.Source(), f.Processor()
		fs.State, fs.LastError = f.State()
		// The stored error is the reason of a stall; once the feed runs
		// again it is history, and the live error is the one that matters.
		if fs.LastError == "" && fs.State == StateStalled {
			fs.LastError = st.LastError
		}
	}
	return fs
}

// setPartitions fills the positions from the stored checkpoints and the
// ends from the running feed (the stored ends when it is stopped).
func (fs *FeedStatus) setPartitions(cps []outbox.Checkpoint, f Feed) {
	byPart := map[int32]*PartitionStatus{}
	for _, c := range cps {
		byPart[c.Partition] = &PartitionStatus{Partition: c.Partition, Epoch: c.Epoch, Position: c.Position, End: c.End}
	}
	if f != nil && fs.State != StateStopped {
		for p, end := range f.Ends() {
			ps, ok := byPart[p]
			if !ok {
				ps = &PartitionStatus{Partition: p}
				byPart[p] = ps
			}
			ps.End = end
		}
	}
	fs.Partitions = make([]PartitionStatus, 0, len(byPart))
	for _, p := range slices.Sorted(maps.Keys(byPart)) {
		ps := *byPart[p]
		ps.Lag = max(ps.End-ps.Position, 0)
		fs.Position += ps.Position
		fs.End += ps.End
		fs.Lag += ps.Lag
		fs.Partitions = append(fs.Partitions, ps)
	}
	if len(fs.Partitions) == 1 {
		fs.Epoch = fs.Partitions[0].Epoch
	}
}

func lossStatuses(ls []outbox.Loss) []LossStatus {
	out := make([]LossStatus, 0, len(ls))
	for _, l := range ls {
		out = append(out, LossStatus{
			At: time.Unix(0, l.At).UTC(), Reason: l.Reason, Partition: l.Partition, Epoch: l.Epoch,
			From: l.From, To: l.To, AckedAt: unixTime(l.AckedAt),
		})
	}
	return out
}

// backlog counts the rows after published, of one feed or of all ("").
func (s *Server) backlog(ctx context.Context, feed string, published int64) (Backlog, error) {
	b, err := s.store.Backlog(ctx, feed, published)
	if err != nil {
		return Backlog{}, err
	}
	return Backlog{Pending: b.Pending, OldestPendingAge: s.age(b.OldestAt)}, nil
}

// age is the time since at (unix nanoseconds) in seconds, 0 for at == 0.
func (s *Server) age(at int64) float64 {
	if at == 0 {
		return 0
	}
	return max(s.store.Now().Sub(time.Unix(0, at)), 0).Seconds()
}

// unixTime converts unix nanoseconds to a UTC time, nil for 0 (never).
func unixTime(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}

// published is the last outbox id known published: the relay's own view,
// or the progress stored in the database when the relay is off or has not
// read it yet.
func (s *Server) published(ctx context.Context) (int64, error) {
	var stored int64
	if err := s.store.ReadDB().GetContext(ctx, &stored, `SELECT coalesce(max(last_id), 0) FROM relay_progress`); err != nil {
		return 0, fmt.Errorf("read relay progress: %w", err)
	}
	if s.relay != nil {
		stored = max(stored, s.relay.Status().LastPublishedID)
	}
	return stored, nil
}
