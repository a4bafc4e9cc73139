package api

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"
)

// readyTimeout bounds the database check; it reads what the store knows
// and at most stats its files, so it does not wait behind a batch.
const readyTimeout = 2 * time.Second

// Health is the body of GET /healthz.
type Health struct {
	Status string `json:"status"`
}

// Readiness is the body of GET /readyz: Ready with every check, and the
// failing checks' messages in Reasons. The checks are the database, the
// relay, each configured feed (named "feed:NAME") and, when state
// queries are configured, "queries": how many run, failing while one
// runs well past its time limit.
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

// handleReadyz serves GET /readyz: 200 when the database is writable, the
// relay (when on) connected and no feed stalled or failed; 503 with the
// reasons otherwise.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	rd := s.readiness(r.Context())
	status := http.StatusOK
	if !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

func (s *Server) readiness(ctx context.Context) Readiness {
	checks := append([]Check{s.databaseCheck(ctx), s.relayCheck()}, s.feedChecks()...)
	if len(s.queries.names) > 0 {
		checks = append(checks, s.queries.check(time.Now()))
	}
	if why := s.starting(); why != "" {
		checks = append([]Check{{Name: "start", Message: why}}, checks...)
	}
	rd := Readiness{Ready: true, Checks: checks, Reasons: []string{}}
	for _, c := range checks {
		if !c.OK {
			rd.Ready = false
			rd.Reasons = append(rd.Reasons, c.Name+": "+c.Message)
		}
	}
	return rd
}

// databaseCheck asks the store whether the database takes writes: it
// answers from its last writes and cheap file checks, never by writing.
func (s *Server) databaseCheck(ctx context.Context) Check {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := s.store.CheckWritable(ctx); err != nil {
		return Check{Name: "database", Message: fmt.Sprintf("not writable: %v", err)}
	}
	return Check{Name: "database", OK: true, Message: "open and writable"}
}

// feedChecks has a check per configured feed: a stalled or failed feed
// fails its check, with its last error.
func (s *Server) feedChecks() []Check {
	checks := make([]Check, 0, len(s.feeds))
	for _, name := range slices.Sorted(maps.Keys(s.feeds)) {
		state, lastError := s.feeds[name].State()
		c := Check{Name: "feed:" + name, OK: state.Healthy(), Message: string(state)}
		if lastError != "" {
			c.Message += ": " + lastError
		}
		checks = append(checks, c)
	}
	return checks
}

// starting is why the server is not running yet, "" once it is.
func (s *Server) starting() string {
	if s.cfg.Starting == nil {
		return ""
	}
	return s.cfg.Starting()
}

func (s *Server) relayCheck() Check {
	if s.relay == nil {
		return Check{Name: "relay", OK: true, Message: "off: outputs stay in the outbox"}
	}
	rs := s.relay.Status()
	switch {
	case string(rs.State) == RelayStateUnauthorized:
		// Connected or not, it publishes nothing until an operator acts.
		return Check{Name: "relay", Message: fmt.Sprintf("unauthorized: %s", rs.LastError)}
	case rs.Connected:
		return Check{Name: "relay", OK: true, Message: "connected (" + string(rs.State) + ")"}
	case rs.LastError != "":
		return Check{Name: "relay", Message: fmt.Sprintf("not connected (%s): %s", rs.State, rs.LastError)}
	default:
		return Check{Name: "relay", Message: fmt.Sprintf("not connected (%s)", rs.State)}
	}
}
