package api

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/outboxd/outboxd/outbox"
)

// AckRequest is the body of POST /feeds/{name}/losses/ack: why the
// operator acknowledges the losses (required).
type AckRequest struct {
	Reason string `json:"reason"`
}

// AckResult is the body of POST /feeds/{name}/losses/ack.
type AckResult struct {
	Feed string `json:"feed"`
	// Acked counts the losses acknowledged by this request (0 when there
	// were none left to acknowledge).
	Acked    int64 `json:"acked"`
	Lossless bool  `json:"lossless"`
	// By is the name of the token that acknowledged them.
	By string `json:"by"`
}

// handleAckLosses serves POST /feeds/{name}/losses/ack: an operator has
// reviewed the feed's losses. They stay in the history, marked acked with
// who (the token's name) and why, and the feed is lossless again.
func (s *Server) handleAckLosses(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	if err := s.known(r.Context(), name); err != nil {
		s.fail(w, r, err)
		return
	}
	var req AckRequest
	if !readBody(w, r, &req) {
		return
	}
	if req.Reason == "" {
		writeError(w, http.StatusBadRequest, CodeBadRequest, errNoReason.Error())
		return
	}
	ack := outbox.LossAck{By: caller(r), Reason: req.Reason}
	n, err := s.store.AckLossesBy(r.Context(), name, ack)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Warn("losses acknowledged by an operator: the feed is lossless again", logKeyFeed, name, "acked", n,
		logKeyBy, ack.By, "reason", ack.Reason)
	writeJSON(w, http.StatusOK, AckResult{Feed: name, Acked: n, Lossless: true, By: ack.By})
}
