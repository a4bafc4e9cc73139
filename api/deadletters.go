package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/outboxd/outboxd/outbox"
)

// Paging of GET /feeds/{name}/dead-letters, and the bounds that keep its
// answers, and the memory serving them, small however large the dead
// letters are.
const (
	DefaultDeadLetterLimit = 100
	MaxDeadLetterLimit     = 1000
	// DeadLetterPageBytes bounds a page's JSON body: a page ends before
	// the dead letter that would take it past this (a page has at least
	// one), and next says where to go on.
	DeadLetterPageBytes = 1 << 20
	// DeadLetterPreviewBytes cuts a dead letter's key and payload (and its
	// error, in characters) in a page; the *Truncated fields say so, and
	// the whole key and payload are served at .../dead-letters/{id}/key
	// and .../payload.
	DeadLetterPreviewBytes = 4 << 10
	// DeadLetterHeadersBytes: a dead letter whose encoded headers are
	// larger has them left out of a page (headersTruncated); they stay
	// stored, and a requeue uses them.
	DeadLetterHeadersBytes = 16 << 10
	// DeadLetterConcurrency is how many dead-letter requests are served
	// at once; the others wait up to deadLetterWait for their turn, then
	// are answered 503 (code busy) with Retry-After.
	DeadLetterConcurrency = 4
	// DeadLetterMemory bounds the memory the dead-letter requests hold:
	// a page buffer per turn (allocated at a turn's first page, then kept
	// and reused), and, per request being served, one dead letter as read,
	// decoded and encoded, or one piece of a whole key or payload.
	DeadLetterMemory = DeadLetterConcurrency * (DeadLetterPageBytes + 3*maxEntryBytes)

	// maxEntryBytes bounds one dead letter's JSON: key and payload previews,
	// an error of as many characters of up to four bytes, and the headers
	// left in, each byte escaped at worst as six (a control character).
	maxEntryBytes = 6*(2*DeadLetterPreviewBytes+4*DeadLetterPreviewBytes+DeadLetterHeadersBytes) + 4<<10
	// deadLetterChunk is the piece a whole key or payload is read and
	// sent in.
	deadLetterChunk = 64 << 10
	// deadLetterWait is how long a dead-letter request waits for its turn.
	deadLetterWait = 5 * time.Second
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
	// Next is the "after" of the next page; null when this page is the
	// last. A page cut by DeadLetterPageBytes or by the limit has one.
	Next *int64 `json:"next"`
}

// DeadLetterJSON is one dead letter in a page. Key, Payload and Error are
// whole unless their *Truncated field says they were cut to a preview
// (KeyBytes and PayloadBytes are the whole sizes); Headers are left out
// (empty) when HeadersTruncated.
type DeadLetterJSON struct {
	ID               int64        `json:"id"`
	Delivery         DeliveryJSON `json:"delivery"`
	Reason           string       `json:"reason"`
	Error            string       `json:"error"`
	ErrorTruncated   bool         `json:"errorTruncated"`
	Attempts         int          `json:"attempts"`
	At               time.Time    `json:"at"`
	RequeuedAt       *time.Time   `json:"requeuedAt"`
	Key              string       `json:"key"`
	KeyEncoding      string       `json:"keyEncoding"`
	KeyBytes         int64        `json:"keyBytes"`
	KeyTruncated     bool         `json:"keyTruncated"`
	Payload          string       `json:"payload"`
	PayloadEncoding  string       `json:"payloadEncoding"`
	PayloadBytes     int64        `json:"payloadBytes"`
	PayloadTruncated bool         `json:"payloadTruncated"`
	Headers          []HeaderJSON `json:"headers"`
	HeadersTruncated bool         `json:"headersTruncated"`
	// Resolution is open, requeued or discarded; ResolvedBy names the
	// token that requeued or discarded it, Note says why (cut to a
	// preview), RequeueEdited is true when the requeue applied an edited
	// payload.
	Resolution    string     `json:"resolution"`
	DiscardedAt   *time.Time `json:"discardedAt"`
	ResolvedBy    string     `json:"resolvedBy"`
	Note          string     `json:"note"`
	RequeueEdited bool       `json:"requeueEdited"`
}

// Resolutions of a dead letter.
const (
	ResolutionOpen      = "open"
	ResolutionRequeued  = "requeued"
	ResolutionDiscarded = "discarded"
)

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

// encodePreview encodes the first bytes of a longer value: a character
// the cut split is left out, so text stays text.
func encodePreview(b []byte, cut bool) (string, string) {
	if cut {
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.Valid(b); i++ {
			b = b[:len(b)-1]
		}
	}
	return encodeBytes(b)
}

func deadLetterJSON(p outbox.DeadLetterPreview) (DeadLetterJSON, error) {
	var hs []outbox.Header
	if !p.HeadersCut() {
		var err error
		if hs, err = outbox.DecodeHeaders(p.Headers); err != nil {
			return DeadLetterJSON{}, fmt.Errorf("dead letter %d: %w", p.ID, err)
		}
	}
	j := DeadLetterJSON{
		ID:       p.ID,
		Delivery: DeliveryJSON{Partition: p.Partition, Epoch: p.Epoch, Position: p.Position, Sequence: p.Sequence},
		Reason:   p.Reason, Error: p.Error, ErrorTruncated: p.ErrorCut, Attempts: p.Attempts,
		At: time.Unix(0, p.At).UTC(), RequeuedAt: unixTime(p.RequeuedAt),
		KeyBytes: p.KeyBytes, KeyTruncated: p.KeyCut(), PayloadBytes: p.PayloadBytes, PayloadTruncated: p.PayloadCut(),
		Headers: make([]HeaderJSON, 0, len(hs)), HeadersTruncated: p.HeadersCut(),
		Resolution: ResolutionOpen, DiscardedAt: unixTime(p.DiscardedAt), ResolvedBy: p.ResolvedBy, Note: p.Note,
		RequeueEdited: p.RequeueEdited,
	}
	switch {
	case p.RequeuedAt != 0:
		j.Resolution = ResolutionRequeued
	case p.DiscardedAt != 0:
		j.Resolution = ResolutionDiscarded
	}
	j.Key, j.KeyEncoding = encodePreview(p.Key, j.KeyTruncated)
	j.Payload, j.PayloadEncoding = encodePreview(p.Payload, j.PayloadTruncated)
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

// filterParams reads ?reason=&open=.
func filterParams(r *http.Request) (outbox.DeadLetterFilter, error) {
	q := r.URL.Query()
	f := outbox.DeadLetterFilter{Reason: q.Get("reason")}
	switch v := q.Get("open"); v {
	case "", "false":
	case "true":
		f.Open = true
	default:
		return f, fmt.Errorf("open: %q, want true or false", v)
	}
	return f, nil
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

// handleDeadLetters serves GET /feeds/{name}/dead-letters: a page of at
// most DeadLetterPageBytes, read and encoded one dead letter at a time into
// its turn's buffer.
func (s *Server) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), chi.URLParam(r, "name")
	after, limit, err := pageParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	filter, err := filterParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	if err := s.known(ctx, name); err != nil {
		s.fail(w, r, err)
		return
	}
	buf, ok := s.deadLetterTurn(w, r)
	if !ok {
		return
	}
	defer func() { s.deadLetterDone(buf) }()
	if buf, err = s.deadLetterPage(ctx, buf, name, filter, after, limit); err != nil {
		s.fail(w, r, err)
		return
	}
	writeBody(w, http.StatusOK, buf)
}

// errPageFull ends a page: the next dead letter would take it past
// DeadLetterPageBytes.
var errPageFull = errors.New("dead-letter page full")

// pageWriter appends to a page's buffer, never past its capacity.
type pageWriter struct{ buf []byte }

func (p *pageWriter) Write(b []byte) (int, error) {
	if len(p.buf)+len(b) > cap(p.buf) {
		return 0, errPageFull
	}
	p.buf = append(p.buf, b...)
	return len(b), nil
}

// pageTail is room kept for the end of a page.
const pageTail = len(`],"next":9223372036854775807}` + "\n")

// deadLetterPage encodes the page into buf (a turn's buffer, reused): each
// dead letter is encoded as it is read, and the page ends before the one
// that would take it past DeadLetterPageBytes.
func (s *Server) deadLetterPage(ctx context.Context, buf []byte, name string, filter outbox.DeadLetterFilter, after int64, limit int) ([]byte, error) {
	head, err := json.Marshal(name)
	if err != nil {
		return nil, err
	}
	if cap(buf) < DeadLetterPageBytes {
		buf = make([]byte, 0, DeadLetterPageBytes)
	}
	buf = append(append(append(buf[:0], `{"feed":`...), head...), `,"deadLetters":[`...)
	// The writer has room for entries only: the page's end always fits.
	pw := &pageWriter{buf: buf[: len(buf) : DeadLetterPageBytes-pageTail]}
	enc := json.NewEncoder(pw)
	n, last, cut := 0, int64(0), false
	err = s.store.EachDeadLetterOf(ctx, name, filter, after, limit, DeadLetterPreviewBytes, DeadLetterHeadersBytes,
		func(p outbox.DeadLetterPreview) error {
			j, err := deadLetterJSON(p)
			if err != nil {
				return err
			}
			mark := len(pw.buf)
			if n > 0 {
				pw.buf = append(pw.buf, ',')
			}
			if err := enc.Encode(j); errors.Is(err, errPageFull) && n > 0 {
				pw.buf, cut = pw.buf[:mark], true
				return outbox.ErrStopEach
			} else if err != nil {
				return fmt.Errorf("encode dead letter %d: %w", p.ID, err)
			}
			n, last = n+1, p.ID
			return nil
		})
	if err != nil {
		return nil, err
	}
	page := append(buf[:len(pw.buf)], `],"next":`...)
	if cut || n == limit {
		page = strconv.AppendInt(page, last, 10)
	} else {
		page = append(page, "null"...)
	}
	return append(page, "}\n"...), nil
}

// handleDeadLetterPart serves GET /feeds/{name}/dead-letters/{id}/key and
// .../payload: the whole bytes, streamed in pieces of deadLetterChunk.
func (s *Server) handleDeadLetterPart(part outbox.DeadLetterPart) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, name := r.Context(), chi.URLParam(r, "name")
		id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
		if err != nil || id < 1 {
			writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("dead letter id %q is not a positive integer", chi.URLParam(r, "id")))
			return
		}
		buf, ok := s.deadLetterTurn(w, r)
		if !ok {
			return
		}
		defer s.deadLetterDone(buf)
		b, size, err := s.store.DeadLetterBytes(ctx, name, id, part, 0, deadLetterChunk)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		for off := int64(0); len(b) > 0; {
			if _, err := w.Write(b); err != nil {
				return // the client went away
			}
			if off += int64(len(b)); off >= size {
				return
			}
			if b, _, err = s.store.DeadLetterBytes(ctx, name, id, part, off, deadLetterChunk); err != nil {
				s.log.Warn("reading a dead letter's bytes", logKeyFeed, name, "id", id, logKeyErr, err)
				return // the length promised is not met: the client sees the cut
			}
		}
	}
}

// deadLetterTurn waits for one of the DeadLetterConcurrency turns, at most
// deadLetterWait, and returns the turn's page buffer; it answers 503 and
// returns false when no turn came.
func (s *Server) deadLetterTurn(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	t := time.NewTimer(s.deadLetterWait)
	defer t.Stop()
	select {
	case buf := <-s.deadLetterTurns:
		return buf, true
	case <-r.Context().Done():
	case <-t.C:
	}
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, CodeBusy,
		fmt.Sprintf("%d dead-letter requests are being served; try again shortly", DeadLetterConcurrency))
	return nil, false
}

// deadLetterDone gives the turn back, with its buffer for the next page.
func (s *Server) deadLetterDone(buf []byte) { s.deadLetterTurns <- buf[:0] }

// RequeueRequest is the optional body of a requeue: an edited payload to
// apply instead of the stored one (text, or base64 with payloadEncoding
// base64), and a note saying why.
type RequeueRequest struct {
	Payload         *string `json:"payload"`
	PayloadEncoding string  `json:"payloadEncoding"`
	Note            string  `json:"note"`
}

// handleRequeue serves POST /feeds/{name}/dead-letters/{id}/requeue.
func (s *Server) handleRequeue(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), chi.URLParam(r, "name")
	id, ok := deadLetterID(w, r)
	if !ok {
		return
	}
	var req RequeueRequest
	if !readBody(w, r, &req) {
		return
	}
	rq := outbox.Requeue{By: caller(r), Note: req.Note}
	if req.Payload != nil {
		b, err := decodeBytes(*req.Payload, req.PayloadEncoding)
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeBadRequest, "payload: "+err.Error())
			return
		}
		rq.Payload = b
	}
	f, ok := s.runningFeed(w, r, name)
	if !ok {
		return
	}
	applied, err := f.Requeue(ctx, id, rq)
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
	if rq.Payload != nil && applied {
		res.Message = "applied with the edited payload"
	}
	if !applied {
		res.Message = "already requeued or discarded: nothing applied"
	}
	s.log.Info("dead letter requeue", logKeyFeed, name, "id", id, "applied", applied, "edited", rq.Payload != nil, logKeyBy, rq.By)
	writeJSON(w, http.StatusOK, res)
}
