package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Readiness checks are cached this long, so probes (or a client hammering
// /readyz) cost at most one small write per interval on the writer
// connection the ingest loops use.
const (
	readyCacheFor = time.Second
	readyTimeout  = 2 * time.Second
)

// Health is the body of GET /healthz.
type Health struct {
	Status string `json:"status"`
}

// Readiness is the body of GET /readyz: Ready with every check, and the
// failing checks' messages in Reasons.
type Readiness struct {
	Ready   bool     `json:"ready"`
	Checks  []Check  `json:"checks"`
	Reasons []string `json:"reasons"`
}

// Check is one readiness check.
type Check struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

// handleHealthz serves GET /healthz: the process is alive and serving.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, Health{Status: "ok"})
}

// handleReadyz serves GET /readyz: 200 when the database is open and
// writable and the relay (when on) is connected, 503 with reasons otherwise.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	rd := s.readiness(r.Context())
	status := http.StatusOK
	if !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

// readyCache remembers the database check for readyCacheFor.
type readyCache struct {
	mu  sync.Mutex
	at  time.Time
	chk Check
}

func (s *Server) readiness(ctx context.Context) Readiness {
	checks := []Check{s.databaseCheck(ctx), s.relayCheck()}
	rd := Readiness{Ready: true, Checks: checks, Reasons: []string{}}
	for _, c := range checks {
		if !c.OK {
			rd.Ready = false
			rd.Reasons = append(rd.Reasons, c.Name+": "+c.Message)
		}
	}
	return rd
}

// databaseCheck writes a row of the meta table through the writer
// connection: that proves the file is open, writable and not locked away.
func (s *Server) databaseCheck(ctx context.Context) Check {
	c := &s.ready
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < readyCacheFor {
		return c.chk
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	_, err := s.store.DB().ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('api.readyz', ?)
ON CONFLICT(key) DO UPDATE SET value = excluded.value`, strconv.FormatInt(s.store.Now().UnixNano(), 10))
	c.chk = Check{Name: "database", OK: true, Message: "open and writable"}
	if err != nil {
		c.chk = Check{Name: "database", Message: fmt.Sprintf("not writable: %v", err)}
	}
	c.at = time.Now()
	return c.chk
}

func (s *Server) relayCheck() Check {
	if s.relay == nil {
		return Check{Name: "relay", OK: true, Message: "off: outputs stay in the outbox"}
	}
	rs := s.relay.Status()
	switch {
	case rs.Connected:
		return Check{Name: "relay", OK: true, Message: "connected (" + rs.State + ")"}
	case rs.LastError != "":
		return Check{Name: "relay", Message: fmt.Sprintf("not connected (%s): %s", rs.State, rs.LastError)}
	default:
		return Check{Name: "relay", Message: fmt.Sprintf("not connected (%s)", rs.State)}
	}
}
