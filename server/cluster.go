package server

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/relay"
)

// sharedIdleInTx is, when servers share the database, how long PostgreSQL
// lets a server's transaction wait on it between statements before it
// ends the session (outbox.Config.IdleInTxTimeout): a server paused in
// the middle of a commit holds the other servers' claims and commits back
// that long at most, well within the group's session timeout. No
// processor a group feed runs waits inside its transaction.
const sharedIdleInTx = 3 * time.Second

// seenEvery is how often a server sharing the database says it is alive.
const seenEvery = time.Second

// relayRunner is how the relay runs: alone on a database of its own, or,
// when servers share the database, only while this server holds the
// relay's lease (relay.Leader).
func (m *Main) relayRunner() func(ctx context.Context) error {
	if m.leader != nil {
		return m.leader.Run
	}
	return m.Relay.Run
}

// newLeader makes the relay's leader when servers share the database.
func (m *Main) newLeader() {
	if m.Config.Shared() {
		m.leader = relay.NewLeader(m.Relay, m.Store, m.serverID(), m.Config.RelayLease, m.Logger)
	}
}

// heartbeat records, every seenEvery until ctx is done, that this server
// sharing the database is alive (its row in /cluster), and removes the row
// at a clean stop.
func (m *Main) heartbeat(ctx context.Context) {
	if !m.Store.Shared() {
		return
	}
	tick := time.NewTicker(seenEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := m.Store.LeaveServer(context.WithoutCancel(ctx), m.serverID()); err != nil {
				m.Logger.Warn("leaving the servers of the database", "err", err)
			}
			return
		case <-tick.C:
		}
		if err := m.Store.SeenServer(ctx, m.serverID()); err != nil && ctx.Err() == nil {
			m.Logger.Warn("recording this server alive", "err", err)
		}
	}
}
