package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/outboxd/outboxd/outbox"
)

// QueryConcurrency is how many state queries run at once: one on each of
// the store's query connections (outbox.QueryConns), which are apart
// from the read pool of the relay and the status endpoints, so queries
// in a loop never stall publishing. A request beyond it waits for a turn.
const QueryConcurrency = outbox.QueryConns

// Error codes of the query endpoint.
const (
	CodeQueryNotReady = "query_not_ready"
	CodeQueryTimeout  = "query_timeout"
	// CodeQueryRefused: a query that read what did not exist at start
	// compiles now, and the check refuses it (two result columns of one
	// name once its tables are there): a start refuses it too.
	CodeQueryRefused = "query_refused"
)

// queries are the named state queries and their limits.
type queries struct {
	byName map[string]*outbox.Query
	names  []string // in configuration order
	limits outbox.QueryLimits
	turns  chan struct{}
	heads  sync.Map // name -> queryHead

	mu      sync.Mutex
	running map[uint64]time.Time // each run under way, by its number: when it began
	runs    uint64               // the runs begun, numbering them
}

// queryOverrun is how long past its time limit a run may take before
// /readyz says the limit does not hold: the interrupt ends a statement
// at once, and a loaded machine may take a while to answer.
const queryOverrun = 5 * time.Second

// began records a run under way; the caller ends it with ended.
func (q *queries) began() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.runs++
	q.running[q.runs] = time.Now()
	return q.runs
}

func (q *queries) ended(run uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.running, run)
}

// check is the queries' readiness check: it fails while a run has lasted
// past its time limit by more than queryOverrun, which the limit should
// never let happen (every run is interrupted at its limit, on every row,
// and when its client leaves).
func (q *queries) check(now time.Time) Check {
	q.mu.Lock()
	n := len(q.running)
	var oldest time.Duration
	for _, t := range q.running {
		oldest = max(oldest, now.Sub(t))
	}
	q.mu.Unlock()
	c := Check{Name: "queries", OK: true, Message: fmt.Sprintf("%d of %d running", n, QueryConcurrency)}
	if oldest > q.limits.Timeout+queryOverrun {
		c.OK = false
		c.Message = fmt.Sprintf("a query has run %v, past its time limit of %v (%d of %d running)",
			oldest.Round(time.Millisecond), q.limits.Timeout, n, QueryConcurrency)
	}
	return c
}

func newQueries(qs []*outbox.Query, lim outbox.QueryLimits) (*queries, error) {
	d := outbox.DefaultQueryLimits()
	if lim.Timeout == 0 {
		lim.Timeout = d.Timeout
	}
	if lim.MaxRows == 0 {
		lim.MaxRows = d.MaxRows
	}
	if lim.MaxBytes == 0 {
		lim.MaxBytes = d.MaxBytes
	}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	q := &queries{byName: make(map[string]*outbox.Query, len(qs)), limits: lim, turns: make(chan struct{}, QueryConcurrency),
		running: map[uint64]time.Time{}}
	for _, x := range qs {
		if _, dup := q.byName[x.Name()]; dup {
			return nil, fmt.Errorf("query %s given twice", x.Name())
		}
		q.byName[x.Name()] = x
		q.names = append(q.names, x.Name())
	}
	return q, nil
}

// QueryInfo describes one configured query in GET /queries.
type QueryInfo struct {
	Name   string   `json:"name"`
	Params []string `json:"params"`
}

// QueryList is the body of GET /queries.
type QueryList struct {
	Queries []QueryInfo `json:"queries"`
	// Limits are the limits every query runs within.
	TimeoutMillis int64 `json:"timeoutMillis"`
	MaxRows       int   `json:"maxRows"`
	MaxBytes      int   `json:"maxBytes"`
}

func (s *Server) handleQueries(w http.ResponseWriter, r *http.Request) {
	l := QueryList{Queries: []QueryInfo{}, TimeoutMillis: s.queries.limits.Timeout.Milliseconds(),
		MaxRows: s.queries.limits.MaxRows, MaxBytes: s.queries.limits.MaxBytes}
	for _, n := range s.queries.names {
		l.Queries = append(l.Queries, QueryInfo{Name: n, Params: s.queries.byName[n].Params()})
	}
	writeJSON(w, http.StatusOK, l)
}

// handleQuery runs a named query with the request's query-string
// parameters: 200 with its rows (cut at a limit, and then saying which),
// 400 for parameters unknown, missing or repeated, 404 for an unknown
// query, 503 while what it reads does not exist yet or all turns are
// taken, 504 past its time limit, 500 query_refused for one the check
// refuses once what it reads exists.
func (s *Server) handleQuery(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	q, ok := s.queries.byName[name]
	if !ok {
		writeError(w, http.StatusNotFound, CodeNotFound, "no query "+name+" is configured")
		return
	}
	params, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "query "+name+": the query string: "+err.Error())
		return
	}
	if !s.queryTurn(w, r) {
		return
	}
	defer func() { <-s.queries.turns }()
	run := s.queries.began()
	// The request's context ends when its client goes away: the store
	// then interrupts the statement, whichever row it is at.
	res, err := s.store.Query(r.Context(), q, params, s.queries.limits)
	s.queries.ended(run)
	if err != nil {
		s.queryFailed(w, r, err)
		return
	}
	writeBody(w, http.StatusOK, s.queries.encode(name, res))
}

// queryTurn waits, at most a query's time limit, for one of the
// QueryConcurrency turns; it answers 503 when none comes.
func (s *Server) queryTurn(w http.ResponseWriter, r *http.Request) bool {
	select {
	case s.queries.turns <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(s.queries.limits.Timeout)
	defer t.Stop()
	select {
	case s.queries.turns <- struct{}{}:
		return true
	case <-t.C:
	case <-r.Context().Done():
	}
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, CodeBusy, fmt.Sprintf("%d queries are running; try again", QueryConcurrency))
	return false
}

func (s *Server) queryFailed(w http.ResponseWriter, r *http.Request, err error) {
	var pe *outbox.ParamError
	switch {
	case r.Context().Err() != nil:
		return // the client is gone: no one to answer
	case errors.As(err, &pe):
		writeError(w, http.StatusBadRequest, CodeBadRequest, pe.Error())
	case errors.Is(err, outbox.ErrQueryNotReady):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, CodeQueryNotReady, err.Error())
	case errors.Is(err, outbox.ErrQueryTimeout):
		writeError(w, http.StatusGatewayTimeout, CodeQueryTimeout, err.Error())
	case errors.Is(err, outbox.ErrQueryRefused):
		s.log.Error("a state query is refused now that what it reads exists: correct it in the configuration, which a start refuses",
			logKeyPath, r.URL.Path, logKeyErr, err)
		writeError(w, http.StatusInternalServerError, CodeQueryRefused,
			err.Error()+" (the configuration must change: a start refuses this query)")
	default:
		s.fail(w, r, err)
	}
}

// encode is the body of a query's answer:
// {"query":NAME,"columns":[...],"rows":[{...},...]} with "truncated":
// "rows" or "bytes" when a limit cut it. Its size is the rows' (at most
// the byte limit) plus the names. The head (the name and the columns,
// the same on every answer of a query) is encoded once.
func (q *queries) encode(name string, res outbox.QueryResult) []byte {
	h, ok := q.heads.Load(name)
	if hd, _ := h.(queryHead); !ok || !slices.Equal(hd.columns, res.Columns) {
		h = queryHead{columns: res.Columns, head: encodeQueryHead(name, res.Columns)}
		q.heads.Store(name, h)
	}
	return appendQueryResult(h.(queryHead).head, res)
}

// queryHead is a query's head encoded, for the columns it was encoded with.
type queryHead struct {
	columns []string
	head    []byte
}

// encodeQueryHead is the start of an answer's body, up to its columns.
func encodeQueryHead(name string, columns []string) []byte {
	head, _ := json.Marshal(struct {
		Query   string   `json:"query"`
		Columns []string `json:"columns"`
	}{name, columns}) // strings always encode
	return head[:len(head)-1]
}

// appendQueryResult is an answer's body after its head.
func appendQueryResult(head []byte, res outbox.QueryResult) []byte {
	b := make([]byte, 0, len(head)+res.Bytes+len(res.Rows)+40)
	b = append(b, head...)
	if res.Truncated != "" {
		b = append(b, `,"truncated":"`+res.Truncated+`"`...)
	}
	b = append(b, `,"rows":[`...)
	for i, row := range res.Rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, row...)
	}
	return append(b, "]}\n"...)
}
