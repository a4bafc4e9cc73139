package api

import (
	"context"
	"net/http"
)

// OutboxStatus is the body of GET /outbox/status.
type OutboxStatus struct {
	// Pending counts the rows after LastPublishedID; OldestPendingAge is
	// how long the oldest of them has waited, in seconds.
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldestPendingAge"`
	// PendingBytes is the bytes of the pending rows' chunks, about what
	// they take on disk, never fewer.
	PendingBytes int64 `json:"pendingBytes"`
	// MaxBacklogBytes and MaxBacklogRows are the backlog's bound (0:
	// none): past it ingest pauses, its feeds' state backpressure.
	MaxBacklogBytes int64 `json:"maxBacklogBytes"`
	MaxBacklogRows  int64 `json:"maxBacklogRows"`
	// Published counts the rows the relay published since it started.
	Published int64 `json:"published"`
	// LastPublishedID is the last outbox id known published; LastOutboxID
	// the last id ever assigned.
	LastPublishedID int64           `json:"lastPublishedId"`
	LastOutboxID    int64           `json:"lastOutboxId"`
	Relay           RelayStatusJSON `json:"relay"`
	// Sinks are the configured sinks (GET /sinks has more of each).
	Sinks []SinkSummary `json:"sinks"`
}

// RelayStatusJSON is the relay as GET /outbox/status shows it. Mode is
// "none" and State "off" when the relay is off.
type RelayStatusJSON struct {
	Mode      string `json:"mode"`
	State     string `json:"state"`
	Connected bool   `json:"connected"`
	LastError string `json:"lastError"`
	Fenced    bool   `json:"fenced"`
}

// outboxStatus reads the outbox's backlog, from one snapshot of the
// store, and the relay's state.
func (s *Server) outboxStatus(ctx context.Context) (OutboxStatus, error) {
	snap, err := s.store.OutboxStatus(ctx, s.published())
	if err != nil {
		return OutboxStatus{}, err
	}
	pending, err := s.store.PendingBacklog(ctx)
	if err != nil {
		return OutboxStatus{}, err
	}
	os := OutboxStatus{
		Pending: snap.Backlog.Pending, OldestPendingAge: s.age(snap.Backlog.OldestAt), LastPublishedID: snap.Published,
		LastOutboxID: snap.LastID, Relay: RelayStatusJSON{Mode: RelayModeNone, State: RelayStateOff},
		PendingBytes: pending.Bytes, MaxBacklogBytes: s.cfg.MaxBacklog.Bytes, MaxBacklogRows: s.cfg.MaxBacklog.Rows,
		Sinks: s.sinkSummaries(),
	}
	if s.relay != nil {
		rs := s.relay.Status()
		os.Published = rs.PublishedTotal
		os.Relay = RelayStatusJSON{Mode: string(rs.Mode), State: string(rs.State), Connected: rs.Connected, LastError: rs.LastError, Fenced: rs.Fenced}
	}
	return os, nil
}

// handleOutboxStatus serves GET /outbox/status.
func (s *Server) handleOutboxStatus(w http.ResponseWriter, r *http.Request) {
	os, err := s.outboxStatus(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, os)
}
