package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/outboxd/outboxd/outbox"
)

// logKeyBy names the token an action was taken with.
const logKeyBy = "by"

// Bounds of one POST .../dead-letters/requeue: it requeues at most
// RequeueAllMax dead letters, for at most requeueAllBudget (well within
// the server's write timeout), then answers with where to go on.
const (
	RequeueAllMax    = 1000
	requeueAllBudget = 10 * time.Second
	// maxFailures bounds the failures listed in one answer.
	maxFailures = 10
)

// DiscardRequest is the body of a discard: why (required).
type DiscardRequest struct {
	Note string `json:"note"`
}

// DiscardResult is the answer to a discard of one dead letter. Discarded
// is false when it was requeued or discarded already.
type DiscardResult struct {
	Feed      string `json:"feed"`
	ID        int64  `json:"id"`
	Discarded bool   `json:"discarded"`
	Message   string `json:"message"`
}

// DiscardAllResult is the answer to a discard of every open dead letter of
// a reason.
type DiscardAllResult struct {
	Feed      string `json:"feed"`
	Reason    string `json:"reason"`
	Discarded int64  `json:"discarded"`
}

// RequeueAllResult is the answer to a requeue of the open dead letters of
// a reason: how many were applied, how many failed again (they stay open;
// the first few are listed), and Next, the "after" to call again with
// when the request's bounds stopped it (null once every one was tried).
type RequeueAllResult struct {
	Feed     string           `json:"feed"`
	Reason   string           `json:"reason"`
	Requeued int64            `json:"requeued"`
	Failed   int64            `json:"failed"`
	Failures []RequeueFailure `json:"failures"`
	Next     *int64           `json:"next"`
}

// RequeueFailure is one dead letter whose requeue failed.
type RequeueFailure struct {
	ID    int64  `json:"id"`
	Error string `json:"error"`
}

// deadLetterID reads the {id} of the path, answering 400 when it is not a
// positive integer.
func deadLetterID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("dead letter id %q is not a positive integer", chi.URLParam(r, "id")))
		return 0, false
	}
	return id, true
}

// readBody decodes the request's JSON body, if any, into v (an empty body
// leaves v as it is), answering 400 for anything else than one JSON
// object of v's fields.
func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(r.Body) // limitBody has read and bounded it
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "reading the request body: "+err.Error())
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "the request body: "+err.Error())
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "the request body: one JSON object expected")
		return false
	}
	return true
}

// decodeBytes is encodeBytes undone: text as is, or base64.
func decodeBytes(s, encoding string) ([]byte, error) {
	switch encoding {
	case "", EncodingUTF8:
		return []byte(s), nil
	case EncodingBase64:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("not base64: %w", err)
		}
		return b, nil
	default:
		return nil, fmt.Errorf("encoding %q: want %s or %s", encoding, EncodingUTF8, EncodingBase64)
	}
}

// runningFeed is the configured feed name, or answers 404 (unknown) or 409
// (known from the database only: no loop to requeue through).
func (s *Server) runningFeed(w http.ResponseWriter, r *http.Request, name string) (Feed, bool) {
	if f, ok := s.feeds[name]; ok {
		return f, true
	}
	if err := s.known(r.Context(), name); err != nil {
		s.fail(w, r, err)
		return nil, false
	}
	writeError(w, http.StatusConflict, CodeFeedNotRunning,
		fmt.Sprintf("feed %s is not configured in this process: configure it to requeue its dead letters", name))
	return nil, false
}

// handleDeadLetter serves GET /feeds/{name}/dead-letters/{id}: one dead
// letter as a page shows it.
func (s *Server) handleDeadLetter(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), chi.URLParam(r, "name")
	id, ok := deadLetterID(w, r)
	if !ok {
		return
	}
	buf, ok := s.deadLetterTurn(w, r)
	if !ok {
		return
	}
	defer s.deadLetterDone(buf)
	var found *DeadLetterJSON
	err := s.store.EachDeadLetterOf(ctx, name, outbox.DeadLetterFilter{}, id-1, 1, DeadLetterPreviewBytes, DeadLetterHeadersBytes,
		func(p outbox.DeadLetterPreview) error {
			if p.ID != id {
				return outbox.ErrStopEach
			}
			j, err := deadLetterJSON(p)
			found = &j
			return err
		})
	switch {
	case err != nil:
		s.fail(w, r, err)
	case found == nil:
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("feed %s has no dead letter %d", name, id))
	default:
		writeJSON(w, http.StatusOK, found)
	}
}

// handleDiscard serves POST /feeds/{name}/dead-letters/{id}/discard.
func (s *Server) handleDiscard(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	id, ok := deadLetterID(w, r)
	if !ok {
		return
	}
	d, ok := discardOf(w, r)
	if !ok {
		return
	}
	done, err := s.store.DiscardDeadLetter(r.Context(), name, id, d)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res := DiscardResult{Feed: name, ID: id, Discarded: done, Message: "discarded"}
	if !done {
		res.Message = "already requeued or discarded: nothing changed"
	}
	s.log.Info("dead letter discarded", logKeyFeed, name, "id", id, "changed", done, logKeyBy, d.By, "note", d.Note)
	writeJSON(w, http.StatusOK, res)
}

// discardOf reads a discard's body: its note is required.
func discardOf(w http.ResponseWriter, r *http.Request) (outbox.Discard, bool) {
	var req DiscardRequest
	if !readBody(w, r, &req) {
		return outbox.Discard{}, false
	}
	if req.Note == "" {
		writeError(w, http.StatusBadRequest, CodeBadRequest, `a discard says why: send {"note": "..."}`)
		return outbox.Discard{}, false
	}
	return outbox.Discard{By: caller(r), Note: req.Note}, true
}

// reasonParam reads the required ?reason= of the actions on every dead
// letter of a reason.
func reasonParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	reason := r.URL.Query().Get("reason")
	if reason == "" {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "reason: required, the dead letters' reason (malformed, line-too-long, ...)")
		return "", false
	}
	return reason, true
}

// handleDiscardAll serves POST /feeds/{name}/dead-letters/discard?reason=.
func (s *Server) handleDiscardAll(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), chi.URLParam(r, "name")
	reason, ok := reasonParam(w, r)
	if !ok {
		return
	}
	d, ok := discardOf(w, r)
	if !ok {
		return
	}
	if err := s.known(ctx, name); err != nil {
		s.fail(w, r, err)
		return
	}
	n, err := s.store.DiscardDeadLetters(ctx, name, reason, d)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("dead letters discarded", logKeyFeed, name, "reason", reason, "discarded", n, logKeyBy, d.By, "note", d.Note)
	writeJSON(w, http.StatusOK, DiscardAllResult{Feed: name, Reason: reason, Discarded: n})
}

// handleRequeueAll serves POST /feeds/{name}/dead-letters/requeue?reason=
// &after=: the open dead letters of the reason, each in a transaction of
// its own as one requeue is, within the request's bounds.
func (s *Server) handleRequeueAll(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), chi.URLParam(r, "name")
	reason, ok := reasonParam(w, r)
	if !ok {
		return
	}
	after, _, err := pageParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	var req struct {
		Note string `json:"note"`
	}
	if !readBody(w, r, &req) {
		return
	}
	f, ok := s.runningFeed(w, r, name)
	if !ok {
		return
	}
	rq := outbox.Requeue{By: caller(r), Note: req.Note}
	res := RequeueAllResult{Feed: name, Reason: reason, Failures: []RequeueFailure{}}
	deadline := time.Now().Add(requeueAllBudget)
	for tried := 0; ; {
		ids, err := s.store.OpenDeadLetterIDs(ctx, name, reason, after, 100)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if len(ids) == 0 {
			break
		}
		if tried >= RequeueAllMax || time.Now().After(deadline) {
			res.Next = &after
			break
		}
		for _, id := range ids {
			if tried >= RequeueAllMax || time.Now().After(deadline) {
				break
			}
			tried++
			after = id
			applied, err := f.Requeue(ctx, id, rq)
			switch {
			case err != nil && ctx.Err() != nil:
				return // the client went away: what was requeued stands
			case err != nil:
				res.Failed++
				if len(res.Failures) < maxFailures {
					res.Failures = append(res.Failures, RequeueFailure{ID: id, Error: err.Error()})
				}
			case applied:
				res.Requeued++
			}
		}
	}
	s.log.Info("dead letters requeued", logKeyFeed, name, "reason", reason, "requeued", res.Requeued, "failed", res.Failed, logKeyBy, rq.By)
	writeJSON(w, http.StatusOK, res)
}

// errNoReason is the answer to an acknowledgement that says not why.
var errNoReason = errors.New(`an acknowledgement says why: send {"reason": "..."}`)
