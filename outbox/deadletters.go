package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// DeadLetterPreview is a dead letter as a listing shows it: its key,
// payload and error cut to a preview, its headers left out when they are
// large, and the whole sizes, so a page of dead letters costs a bounded
// number of bytes however large the items were.
type DeadLetterPreview struct {
	DeadLetter
	// KeyBytes, PayloadBytes and HeadersBytes are the whole sizes of the
	// stored key, payload and encoded headers. Key and Payload hold their
	// first bytes only when shorter than these; Headers is nil when the
	// headers were left out (HeadersBytes > 0).
	KeyBytes     int64 `db:"key_bytes"`
	PayloadBytes int64 `db:"payload_bytes"`
	HeadersBytes int64 `db:"headers_bytes"`
	// ErrorCut is true when Error holds only the first characters.
	ErrorCut bool `db:"error_cut"`
	// RequeueEdited is true when a requeue applied an edited payload
	// (Resolution.RequeuedPayload, which a preview does not carry).
	RequeueEdited bool `db:"requeue_edited"`
}

// KeyCut reports whether Key is shorter than the stored key.
func (p DeadLetterPreview) KeyCut() bool { return int64(len(p.Key)) < p.KeyBytes }

// PayloadCut reports whether Payload is shorter than the stored payload.
func (p DeadLetterPreview) PayloadCut() bool { return int64(len(p.Payload)) < p.PayloadBytes }

// HeadersCut reports whether the headers were left out.
func (p DeadLetterPreview) HeadersCut() bool { return p.Headers == nil && p.HeadersBytes > 0 }

// ErrStopEach, returned by EachDeadLetter's callback, ends the listing
// early without an error.
var ErrStopEach = errors.New("stop listing")

const deadLetterPreviews = `SELECT id, feed, partition, epoch, position, sequence, attempts, reason,
substr(error, 1, ?1) AS error, length(error) > ?1 AS error_cut,
substr(key, 1, ?1) AS key, substr(payload, 1, ?1) AS payload,
CASE WHEN length(headers) <= ?2 THEN headers END AS headers,
coalesce(length(key), 0) AS key_bytes, coalesce(length(payload), 0) AS payload_bytes,
coalesce(length(headers), 0) AS headers_bytes, at, requeued_at,
discarded_at, resolved_by, substr(resolution_note, 1, ?1) AS resolution_note, requeued_payload IS NOT NULL AS requeue_edited
FROM dead_letters WHERE feed = ?3 AND id > ?4 AND (?6 = '' OR reason = ?6)
AND (?7 = 0 OR (requeued_at = 0 AND discarded_at = 0)) ORDER BY id LIMIT ?5`

// DeadLetterFilter narrows a listing of dead letters: to one reason (""
// for all), to those no one requeued or discarded (Open).
type DeadLetterFilter struct {
	Reason string
	Open   bool
}

// EachDeadLetter calls f with up to limit dead letters of feed with id >
// after, in id order, each cut to preview bytes of key and payload (and
// characters of error), its headers left out when their encoding is over
// maxHeaders bytes. Rows are read one at a time: only the one f is given
// is in memory. f returning ErrStopEach ends the listing, and
// EachDeadLetter returns nil; any other error of f is returned.
func (s *Store) EachDeadLetter(ctx context.Context, feed string, after int64, limit, preview, maxHeaders int,
	f func(DeadLetterPreview) error) error {
	return s.EachDeadLetterOf(ctx, feed, DeadLetterFilter{}, after, limit, preview, maxHeaders, f)
}

// EachDeadLetterOf is EachDeadLetter of the dead letters filter keeps
// (the resolution's note cut to preview characters too).
func (s *Store) EachDeadLetterOf(ctx context.Context, feed string, filter DeadLetterFilter, after int64, limit, preview, maxHeaders int,
	f func(DeadLetterPreview) error) error {
	rows, err := s.rdb.QueryxContext(ctx, deadLetterPreviews, preview, maxHeaders, feed, after, limit, filter.Reason, filter.Open)
	if err != nil {
		return fmt.Errorf("read dead letters of %s: %w", feed, err)
	}
	defer rows.Close()
	for rows.Next() {
		var p DeadLetterPreview
		if err := rows.StructScan(&p); err != nil {
			return fmt.Errorf("read dead letters of %s: %w", feed, err)
		}
		if err := f(p); errors.Is(err, ErrStopEach) {
			return nil
		} else if err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read dead letters of %s: %w", feed, err)
	}
	return nil
}

// DeadLetterPart names a part of a dead letter DeadLetterBytes reads.
type DeadLetterPart string

// The parts of a dead letter that can be read in pieces.
const (
	PartKey     DeadLetterPart = "key"
	PartPayload DeadLetterPart = "payload"
)

// DeadLetterBytes returns up to n bytes of part of dead letter id of feed,
// from byte offset off (0 is the first), and the part's whole size, so a
// large payload can be sent in pieces of a bounded size. It returns an
// error wrapping ErrNotFound when the feed has no such dead letter.
func (s *Store) DeadLetterBytes(ctx context.Context, feed string, id int64, part DeadLetterPart, off int64, n int) ([]byte, int64, error) {
	var col string
	switch part {
	case PartKey:
		col = "key"
	case PartPayload:
		col = "payload"
	default:
		return nil, 0, fmt.Errorf("dead letter part %q: want key or payload", part)
	}
	var r struct {
		Bytes []byte `db:"bytes"`
		Size  int64  `db:"size"`
	}
	// The column is one of two names above, never input.
	err := s.rdb.GetContext(ctx, &r, `SELECT substr(`+col+`, ?, ?) AS bytes, coalesce(length(`+col+`), 0) AS size
FROM dead_letters WHERE feed = ? AND id = ?`, off+1, n, feed, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, fmt.Errorf("dead letter %d of %s: %w", id, feed, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read %s of dead letter %d of %s: %w", part, id, feed, err)
	}
	return r.Bytes, r.Size, nil
}
