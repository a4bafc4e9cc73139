package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/outboxd/outboxd/outbox"
)

// Paging of GET /feeds/{name}/dead-letters.
const (
	DefaultDeadLetterLimit = 100
	MaxDeadLetterLimit     = 1000
)

// Encodings of bytes in JSON: text when the bytes are valid UTF-8, base64
// (standard, padded) otherwise.
const (
	EncodingUTF8   = "utf-8"
	EncodingBase64 = "base64"
)

// DeadLetterPage is the body of GET /feeds/{name}/dead-letters.
type DeadLetterPage struct {
	Feed        string           `json:"feed"`
	DeadLetters []DeadLetterJSON `json:"deadLetters"`
	// Next is the "after" of the next page; null when this page is the last.
	Next *int64 `json:"next"`
}

// DeadLetterJSON is one dead letter, kept whole.
type DeadLetterJSON struct {
	ID              int64        `json:"id"`
	Delivery        DeliveryJSON `json:"delivery"`
	Reason          string       `json:"reason"`
	Error           string       `json:"error"`
	Attempts        int          `json:"attempts"`
	At              time.Time    `json:"at"`
	RequeuedAt      *time.Time   `json:"requeuedAt"`
	Key             string       `json:"key"`
	KeyEncoding     string       `json:"keyEncoding"`
	Payload         string       `json:"payload"`
	PayloadEncoding string       `json:"payloadEncoding"`
	Headers         []HeaderJSON `json:"headers"`
}

// DeliveryJSON is where a dead letter came from.
type DeliveryJSON struct {
	Partition int32  `json:"partition"`
	Epoch     string `json:"epoch"`
	Position  int64  `json:"position"`
	Sequence  int64  `json:"sequence"`
}

// HeaderJSON is one header of a dead-lettered Kafka record.
type HeaderJSON struct {
	Key           string `json:"key"`
	Value         string `json:"value"`
	ValueEncoding string `json:"valueEncoding"`
}

// RequeueResult is the body of a requeue's answer. Requeued is false when
// the dead letter had been requeued already (nothing was applied again).
type RequeueResult struct {
	Feed     string `json:"feed"`
	ID       int64  `json:"id"`
	Requeued bool   `json:"requeued"`
	Message  string `json:"message"`
}

func encodeBytes(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), EncodingUTF8
	}
	return base64.StdEncoding.EncodeToString(b), EncodingBase64
}

func deadLetterJSON(d outbox.DeadLetter) (DeadLetterJSON, error) {
	hs, err := outbox.DecodeHeaders(d.Headers)
	if err != nil {
		return DeadLetterJSON{}, fmt.Errorf("dead letter %d: %w", d.ID, err)
	}
	j := DeadLetterJSON{
		ID:       d.ID,
		Delivery: DeliveryJSON{Partition: d.Partition, Epoch: d.Epoch, Position: d.Position, Sequence: d.Sequence},
		Reason:   d.Reason, Error: d.Error, Attempts: d.Attempts,
		At: time.Unix(0, d.At).UTC(), RequeuedAt: unixTime(d.RequeuedAt),
		Headers: make([]HeaderJSON, 0, len(hs)),
	}
	j.Key, j.KeyEncoding = encodeBytes(d.Key)
	j.Payload, j.PayloadEncoding = encodeBytes(d.Payload)
	for _, h := range hs {
		v, enc := encodeBytes(h.Value)
		j.Headers = append(j.Headers, HeaderJSON{Key: h.Key, Value: v, ValueEncoding: enc})
	}
	return j, nil
}

// known returns an error wrapping outbox.ErrNotFound unless the feed is
// configured or stored.
func (s *Server) known(ctx context.Context, name string) error {
	if _, ok := s.feeds[name]; ok {
		return nil
	}
	_, err := s.store.Feed(ctx, name)
	return err
}

// pageParams reads ?after=&limit=.
func pageParams(r *http.Request) (after int64, limit int, err error) {
	q := r.URL.Query()
	limit = DefaultDeadLetterLimit
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			return 0, 0, fmt.Errorf("after: %q is not an id (a non-negative integer)", v)
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > MaxDeadLetterLimit {
			return 0, 0, fmt.Errorf("limit: %q, want 1 to %d", v, MaxDeadLetterLimit)
		}
	}
	return after, limit, nil
}

// handleDeadLetters serves GET /feeds/{name}/dead-letters.
func (s *Server) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), chi.URLParam(r, "name")
	after, limit, err := pageParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	if err := s.known(ctx, name); err != nil {
		s.fail(w, r, err)
		return
	}
	ds, err := s.store.DeadLetters(ctx, name, after, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page := DeadLetterPage{Feed: name, DeadLetters: make([]DeadLetterJSON, 0, len(ds))}
	for _, d := range ds {
		j, err := deadLetterJSON(d)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		page.DeadLetters = append(page.DeadLetters, j)
	}
	if len(ds) == limit {
		next := ds[len(ds)-1].ID
		page.Next = &next
	}
	writeJSON(w, http.StatusOK, page)
}

// handleRequeue serves POST /feeds/{name}/dead-letters/{id}/requeue.
func (s *Server) handleRequeue(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), chi.URLParam(r, "name")
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("dead letter id %q is not a positive integer", chi.URLParam(r, "id")))
		return
	}
	f, ok := s.feeds[name]
	if !ok {
		if err := s.known(ctx, name); err != nil {
			s.fail(w, r, err)
			return
		}
		writeError(w, http.StatusConflict, CodeFeedNotRunning,
			fmt.Sprintf("feed %s is not configured in this process: configure it to requeue its dead letters", name))
		return
	}
	applied, err := f.Requeue(ctx, id)
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("feed %s has no dead letter %d", name, id))
		return
	case err != nil:
		s.log.Warn("requeue failed", logKeyFeed, name, "id", id, logKeyErr, err)
		writeError(w, http.StatusUnprocessableEntity, CodeRequeueFailed, err.Error())
		return
	}
	res := RequeueResult{Feed: name, ID: id, Requeued: applied, Message: "applied"}
	if !applied {
		res.Message = "already requeued: nothing applied again"
	}
	s.log.Info("dead letter requeue", logKeyFeed, name, "id", id, "applied", applied)
	writeJSON(w, http.StatusOK, res)
}
