package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/outboxd/outboxd/outbox"
)

// Error codes of the JSON error body. They are stable: clients may match
// on them; messages are for people and may change.
const (
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeBadRequest       = "bad_request"
	CodeUnauthorized     = "unauthorized"
	CodeAdminDisabled    = "admin_disabled"
	CodeBodyTooLarge     = "body_too_large"
	CodeFeedNotRunning   = "feed_not_running"
	CodeStarting         = "starting"
	CodeRequeueFailed    = "requeue_failed"
	CodeBusy             = "busy"
	CodeInternal         = "internal"
)

// ErrorBody is the body of every error response:
// {"error":{"code":"not_found","message":"..."}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeJSON writes v as the response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own types are encoded here: a failure is a bug.
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	writeBody(w, status, append(b, '\n'))
}

// writeBody writes b, a JSON document, as the response with the given
// status.
func writeBody(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b)
}

// writeError writes the JSON error body.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code, Message: msg}})
}

// fail answers a failed request: 404 for outbox.ErrNotFound, otherwise a
// 500 whose details go to the log, not to the client.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, outbox.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeNotFound, err.Error())
		return
	}
	s.log.Error("request failed", logKeyMethod, r.Method, logKeyPath, r.URL.Path, logKeyErr, err)
	writeError(w, http.StatusInternalServerError, CodeInternal, "internal error; see the server log")
}

// Log keys of the API.
const (
	logKeyMethod = "method"
	logKeyPath   = "path"
	logKeyStatus = "status"
	logKeyErr    = "err"
	logKeyAddr   = "addr"
	logKeyFeed   = "feed"
	logKeyPanic  = "panic"
	logKeyStack  = "stack"
	logKeyDur    = "duration"
)
