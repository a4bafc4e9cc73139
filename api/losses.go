package api

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// AckResult is the body of POST /feeds/{name}/losses/ack.
type AckResult struct {
	Feed string `json:"feed"`
	// Acked counts the losses acknowledged by this request (0 when there
	// were none left to acknowledge).
	Acked    int64 `json:"acked"`
	Lossless bool  `json:"lossless"`
}

// handleAckLosses serves POST /feeds/{name}/losses/ack: an operator has
// reviewed the feed's losses. They stay in the history, marked acked, and
// the feed is lossless again.
func (s *Server) handleAckLosses(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	n, err := s.store.AckLosses(r.Context(), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Warn("losses acknowledged by an operator: the feed is lossless again", logKeyFeed, name, "acked", n)
	writeJSON(w, http.StatusOK, AckResult{Feed: name, Acked: n, Lossless: true})
}
