package api

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// FeedStatus is the body of GET /feeds/{name}/status.
type FeedStatus struct {
	Feed      string `json:"feed"`
	Kind      string `json:"kind"`
	Source    string `json:"source"`
	Processor string `json:"processor"`
	// State is where the feed stands; a feed known only from the database
	// (no longer configured) is stopped. Running and caught-up are told
	// apart by the positions and ends shown beside it: caught-up exactly
	// when Lag is 0.
	State outbox.FeedState `json:"state"`
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

	Lossless bool `json:"lossless"`
	// Losses are the most recent losses (at most outbox.MaxSnapshotLosses),
	// oldest first; LossCount counts them all.
	Losses    []LossStatus `json:"losses"`
	LossCount int64        `json:"lossCount"`

	LastError     string     `json:"lastError"`
	LastAppliedAt *time.Time `json:"lastAppliedAt"`

	Outbox Backlog `json:"outbox"`
	// Topics are the Kafka topics the feed's outputs go to (empty for a
	// feed that is not configured, or whose Feed does not say).
	Topics []string `json:"topics"`

	// Recording is the feed's recording; absent when it is not recorded.
	Recording *RecordingStatus `json:"recording,omitempty"`
}

// FeedTopics is implemented by a Feed that knows the topics its outputs
// go to (outputs, dead letters, retries); the status lists them.
type FeedTopics interface {
	Topics() []string
}

// PartitionStatus is where one partition of a feed stands.
type PartitionStatus struct {
	Partition int32  `json:"partition"`
	Epoch     string `json:"epoch"`
	Position  int64  `json:"position"`
	End       int64  `json:"end"`
	Lag       int64  `json:"lag"`
	// Owner and OwnerEpoch, for a feed shared by servers (a consumer
	// group), name the server holding the partition ("" when none does)
	// and its owner epoch; absent otherwise.
	Owner      string `json:"owner,omitempty"`
	OwnerEpoch int64  `json:"ownerEpoch,omitempty"`
}

// LossStatus is one loss of a feed: input it moved past without keeping its
// effects. Acknowledged losses stay listed, with AckedAt set. To is nil,
// and Extent ExtentUnknown, when nothing tells how far the lost input went
// (the bytes a file held past From before it was truncated, with no copy
// left).
type LossStatus struct {
	At        time.Time  `json:"at"`
	Reason    string     `json:"reason"`
	Partition int32      `json:"partition"`
	Epoch     string     `json:"epoch"`
	From      int64      `json:"from"`
	To        *int64     `json:"to"`
	Extent    string     `json:"extent"`
	AckedAt   *time.Time `json:"ackedAt"`
	// AckedBy names the token that acknowledged the loss; AckReason says
	// why ("" for losses acknowledged before tokens had names).
	AckedBy   string `json:"ackedBy"`
	AckReason string `json:"ackReason"`
}

// Extents of a loss.
const (
	ExtentKnown   = "known"   // From..To is the lost range
	ExtentUnknown = "unknown" // input from From on was lost, how much is not known
)

// Backlog is how many outbox rows wait to be published and how long the
// oldest has waited, in seconds (0 when none waits).
type Backlog struct {
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldestPendingAge"`
}

// published is the last outbox id the relay knows published, from its
// memory (0 when it is off); the store takes the larger of it and the
// progress it holds.
func (s *Server) published() int64 {
	if s.relay == nil {
		return 0
	}
	return s.relay.Status().LastPublishedID
}

// feedStatus reads one feed's status from one snapshot of the store. It
// returns an error wrapping outbox.ErrNotFound for a feed neither
// configured nor stored.
func (s *Server) feedStatus(ctx context.Context, name string) (FeedStatus, error) {
	f := s.feeds[name]
	snap, err := s.store.FeedStatus(ctx, name, s.published())
	switch {
	case errors.Is(err, outbox.ErrNotFound) && f != nil:
		snap = unregistered(name) // configured, not yet registered
	case err != nil:
		return FeedStatus{}, err
	}
	fs := s.statusOf(snap, f)
	if err := s.setOwners(ctx, &fs); err != nil {
		return FeedStatus{}, err
	}
	return fs, nil
}

// feedStatuses reads the status of every feed, configured or stored, by
// name, from one snapshot of the store.
func (s *Server) feedStatuses(ctx context.Context) ([]FeedStatus, error) {
	snaps, err := s.store.FeedStatuses(ctx, s.published())
	if err != nil {
		return nil, err
	}
	byName := make(map[string]outbox.FeedSnapshot, len(snaps))
	for _, snap := range snaps {
		byName[snap.Name] = snap
	}
	for name := range s.feeds {
		if _, ok := byName[name]; !ok {
			byName[name] = unregistered(name)
		}
	}
	out := make([]FeedStatus, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, s.statusOf(byName[name], s.feeds[name]))
	}
	return out, nil
}

// unregistered is the snapshot of a configured feed the store does not
// know yet: nothing applied, nothing lost.
func unregistered(name string) outbox.FeedSnapshot {
	return outbox.FeedSnapshot{FeedStats: outbox.FeedStats{FeedInfo: outbox.FeedInfo{Name: name}, Lossless: true}}
}

// statusOf builds the status of a feed from its snapshot and, when it is
// configured, the running feed.
func (s *Server) statusOf(snap outbox.FeedSnapshot, f Feed) FeedStatus {
	fs := newFeedStatus(snap.Name, snap.FeedStats, f)
	fs.setPartitions(snap.Positions, f)
	fs.Losses, fs.LossCount = lossStatuses(snap.Losses), snap.LossCount
	fs.Outbox = Backlog{Pending: snap.Backlog.Pending, OldestPendingAge: s.age(snap.Backlog.OldestAt)}
	if fs.State.Moving() {
		// From the positions and ends shown, so the state and the lag agree.
		fs.State = outbox.StateRunning
		if fs.Lag == 0 {
			fs.State = outbox.StateCaughtUp
		}
	}
	return fs
}

// newFeedStatus fills the description, state and counters. A configured
// feed describes itself; a stored one is described by the database.
func newFeedStatus(name string, st outbox.FeedStats, f Feed) FeedStatus {
	fs := FeedStatus{
		Feed: name, Kind: st.Kind, Source: st.Source, Processor: st.Processor, State: outbox.StateStopped,
		Applied: st.Applied, ReplaysSkipped: st.ReplaysSkipped, Retries: st.Retries,
		DeadLettered: st.DeadLettered, CompletionFailures: st.CompletionFailures,
		EpochChanges: st.EpochChanges, Lossless: st.Lossless, LastError: st.LastError,
		LastAppliedAt: unixTime(st.LastAppliedAt),
	}
	fs.Topics = []string{}
	if ft, ok := f.(FeedTopics); ok && f != nil {
		fs.Topics = append(fs.Topics, ft.Topics()...)
	}
	if f != nil {
		fs.Configured = true
		fs.Kind, fs.Source, fs.Processor = f.Kind(), f.Source(), f.Processor()
		fs.Recording = recordingOf(f)
		fs.State, fs.LastError = f.State()
		// The stored error is the reason of a stall; once the feed runs
		// again it is history, and the live error is the one that matters.
		if fs.LastError == "" && fs.State == outbox.StateStalled {
			fs.LastError = st.LastError
		}
	}
	return fs
}

// setPartitions fills the positions from the stored checkpoints and the
// ends from the running feed, read once (the stored ends when it is not
// running).
func (fs *FeedStatus) setPartitions(cps []outbox.Checkpoint, f Feed) {
	byPart := map[int32]*PartitionStatus{}
	for _, c := range cps {
		byPart[c.Partition] = &PartitionStatus{Partition: c.Partition, Epoch: c.Epoch, Position: c.Position, End: c.End}
	}
	if f != nil && fs.State != outbox.StateStopped && fs.State != outbox.StateFailed {
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
		st := LossStatus{
			At: time.Unix(0, l.At).UTC(), Reason: l.Reason, Partition: l.Partition, Epoch: l.Epoch,
			From: l.From, Extent: ExtentUnknown, AckedAt: unixTime(l.AckedAt), AckedBy: l.AckedBy, AckReason: l.AckReason,
		}
		if l.To >= 0 { // a negative To (ingest.UnknownPosition) is an unknown extent
			to := l.To
			st.To, st.Extent = &to, ExtentKnown
		}
		out = append(out, st)
	}
	return out
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
