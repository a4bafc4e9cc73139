package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The history the server keeps, so that a page opened now shows the last
// minutes at once and every rate comes from the server's clock: a sample
// of every feed and of the relay every HistoryInterval, for HistorySpan.
// Its answer is at most HistoryMaxBytes of JSON (its memory less): with
// many feeds, fewer samples are kept.
const (
	HistoryInterval = time.Second
	HistorySpan     = 15 * time.Minute
	HistoryMaxBytes = 2 << 20

	historySamples = int(HistorySpan / HistoryInterval)
	// numberBytes is the most a number takes in the answer: a float64 and
	// its comma.
	numberBytes = 25
	// sampleNumbers are the numbers of a sample besides its feeds': its
	// time and the relay's four; a feed has feedNumbers.
	sampleNumbers = 5
	feedNumbers   = 5
)

// Units of a feed's lag and positions.
const (
	UnitBytes   = "bytes"   // a file feed: byte offsets
	UnitRecords = "records" // a Kafka feed: record offsets
)

// unitOf is the unit of a feed kind's positions and lag.
func unitOf(kind string) string {
	if kind == "kafka" {
		return UnitRecords
	}
	return UnitBytes
}

// sample is the server at one moment.
type sample struct {
	at                 int64 // unix milliseconds, the store's clock
	published, pending int64 // last published outbox id; rows pending
	pendingBytes       int64
	oldestAge          float64
	feeds              []feedSample // by history.names; shorter when a feed came later
}

// feedSample is one feed at one moment.
type feedSample struct {
	applied, deadLettered, lag, pending int64
	ok                                  bool
}

// history is the ring of the latest samples.
type history struct {
	mu      sync.Mutex
	names   []string // feeds in order of appearance
	kinds   []string
	index   map[string]int
	samples []sample // oldest first, at most limit()
}

func newHistory() *history { return &history{index: map[string]int{}} }

// limit is how many samples fit the byte bound with the feeds known.
func (h *history) limit() int {
	per := numberBytes * (sampleNumbers + feedNumbers*len(h.names))
	names := 0
	for _, n := range h.names {
		names += len(n)*6 + 128 // escaped at worst, and the feed's keys
	}
	return max(2, min(historySamples, (HistoryMaxBytes-4096-names)/per))
}

// add appends a sample of the server as read in ov's feeds and outbox.
func (h *history) add(at time.Time, feeds []FeedStatus, os OutboxStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sm := sample{at: at.UnixMilli(), published: os.LastPublishedID, pending: os.Pending, pendingBytes: os.PendingBytes,
		oldestAge: os.OldestPendingAge}
	for _, fs := range feeds {
		if _, ok := h.index[fs.Feed]; !ok {
			h.index[fs.Feed] = len(h.names)
			h.names = append(h.names, fs.Feed)
			h.kinds = append(h.kinds, fs.Kind)
		}
	}
	sm.feeds = make([]feedSample, len(h.names))
	for _, fs := range feeds {
		i := h.index[fs.Feed]
		h.kinds[i] = fs.Kind
		sm.feeds[i] = feedSample{applied: fs.Applied, deadLettered: fs.DeadLettered, lag: fs.Lag, pending: fs.Outbox.Pending, ok: true}
	}
	if n := len(h.samples); n > 0 && h.samples[n-1].at >= sm.at {
		h.samples[n-1] = sm // the clock did not move: the newer reading stands
	} else {
		h.samples = append(h.samples, sm)
	}
	if over := len(h.samples) - h.limit(); over > 0 {
		h.samples = slices.Delete(h.samples, 0, over)
	}
}

// HistoryJSON is the body of GET /history: the samples' times (unix
// milliseconds, the server's clock) and, for each, the relay's and each
// feed's figures, every series aligned with Times. A rate is the growth
// since the sample before divided by the seconds between them (null for
// the first sample kept); a figure is null where the feed was not yet
// known.
type HistoryJSON struct {
	IntervalSeconds float64           `json:"intervalSeconds"`
	SpanSeconds     float64           `json:"spanSeconds"`
	Times           []int64           `json:"times"`
	Relay           RelayHistoryJSON  `json:"relay"`
	Feeds           []FeedHistoryJSON `json:"feeds"`
	// Units names each series' unit.
	Units map[string]string `json:"units"`
}

// RelayHistoryJSON is the relay's and the outbox's series.
type RelayHistoryJSON struct {
	PublishedPerSecond []*float64 `json:"publishedPerSecond"`
	Pending            []int64    `json:"pending"`
	PendingBytes       []int64    `json:"pendingBytes"`
	OldestPendingAge   []float64  `json:"oldestPendingAge"`
}

// FeedHistoryJSON is one feed's series. LagUnit is bytes for a file
// feed, records for a Kafka feed.
type FeedHistoryJSON struct {
	Feed             string     `json:"feed"`
	Kind             string     `json:"kind"`
	LagUnit          string     `json:"lagUnit"`
	AppliedPerSecond []*float64 `json:"appliedPerSecond"`
	DeadLetters      []*int64   `json:"deadLetters"`
	Lag              []*int64   `json:"lag"`
	Pending          []*int64   `json:"pending"`
}

// json renders the samples after since (unix milliseconds; 0: all).
func (h *history) json(since int64) HistoryJSON {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := HistoryJSON{IntervalSeconds: HistoryInterval.Seconds(), SpanSeconds: HistorySpan.Seconds(),
		Times: []int64{}, Feeds: []FeedHistoryJSON{},
		Units: map[string]string{"publishedPerSecond": "rows/s", "pending": "rows", "pendingBytes": "bytes",
			"oldestPendingAge": "s", "appliedPerSecond": "items/s", "deadLetters": "dead letters per interval",
			"lag": "bytes (file) or records (kafka): see lagUnit"}}
	out.Relay = RelayHistoryJSON{PublishedPerSecond: []*float64{}, Pending: []int64{}, PendingBytes: []int64{}, OldestPendingAge: []float64{}}
	for i, name := range h.names {
		out.Feeds = append(out.Feeds, FeedHistoryJSON{Feed: name, Kind: h.kinds[i], LagUnit: unitOf(h.kinds[i]),
			AppliedPerSecond: []*float64{}, DeadLetters: []*int64{}, Lag: []*int64{}, Pending: []*int64{}})
	}
	for i, sm := range h.samples {
		if sm.at <= since {
			continue
		}
		var prev *sample
		if i > 0 {
			prev = &h.samples[i-1]
		}
		out.Times = append(out.Times, sm.at)
		r := &out.Relay
		r.Pending = append(r.Pending, sm.pending)
		r.PendingBytes = append(r.PendingBytes, sm.pendingBytes)
		r.OldestPendingAge = append(r.OldestPendingAge, sm.oldestAge)
		var pub *float64
		if prev != nil {
			pub = perSecond(sm.published-prev.published, sm.at-prev.at)
		}
		r.PublishedPerSecond = append(r.PublishedPerSecond, pub)
		for f := range out.Feeds {
			fh := &out.Feeds[f]
			var cur, old feedSample
			if f < len(sm.feeds) {
				cur = sm.feeds[f]
			}
			if prev != nil && f < len(prev.feeds) {
				old = prev.feeds[f]
			}
			if !cur.ok {
				fh.AppliedPerSecond, fh.DeadLetters = append(fh.AppliedPerSecond, nil), append(fh.DeadLetters, nil)
				fh.Lag, fh.Pending = append(fh.Lag, nil), append(fh.Pending, nil)
				continue
			}
			var rate *float64
			var dead *int64
			if old.ok {
				rate = perSecond(cur.applied-old.applied, sm.at-prev.at)
				d := max(cur.deadLettered-old.deadLettered, 0)
				dead = &d
			}
			lag, pending := cur.lag, cur.pending
			fh.AppliedPerSecond, fh.DeadLetters = append(fh.AppliedPerSecond, rate), append(fh.DeadLetters, dead)
			fh.Lag, fh.Pending = append(fh.Lag, &lag), append(fh.Pending, &pending)
		}
	}
	return out
}

// perSecond is n per the milliseconds ms, nil when no time passed; a
// counter that went down (a restart's relay) counts as 0.
func perSecond(n, ms int64) *float64 {
	if ms <= 0 {
		return nil
	}
	r := float64(max(n, 0)) / (float64(ms) / 1000)
	return &r
}

// RecordHistory takes one sample of every feed and of the relay into the
// history now. An open server does so every HistoryInterval by itself;
// tests and tools call it to sample at a moment of their choice.
func (s *Server) RecordHistory(ctx context.Context) error {
	feeds, err := s.feedStatuses(ctx)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	os, err := s.outboxStatus(ctx)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	s.history.add(s.store.Now(), feeds, os)
	return nil
}

// sampleHistory records the history every HistoryInterval until ctx is
// done.
func (s *Server) sampleHistory(ctx context.Context) {
	every := s.cfg.HistoryEvery
	if every < 0 {
		return
	}
	if every == 0 {
		every = HistoryInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		sctx, cancel := context.WithTimeout(ctx, every)
		err := s.sampleOnce(sctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			s.log.Warn("sampling the history failed; the dashboard's charts have a gap until it works again", logKeyErr, err)
		case err == nil && failing:
			s.log.Info("sampling the history works again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleOnce is RecordHistory with a panic (of a feed's State, say) turned
// into an error: a handler's panic is answered 500, the sampler's must not
// end the process either.
func (s *Server) sampleOnce(ctx context.Context) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("history: panic: %v", p)
		}
	}()
	return s.RecordHistory(ctx)
}

// handleHistory serves GET /history?since=: the samples after since (unix
// milliseconds), all of them without.
func (s *Server) handleHistory(w http.ResponseWriter, r *http.Request) {
	var since int64
	if v := r.URL.Query().Get("since"); v != "" {
		var err error
		if since, err = strconv.ParseInt(v, 10, 64); err != nil || since < 0 {
			writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("since: %q is not unix milliseconds", v))
			return
		}
	}
	writeJSON(w, http.StatusOK, s.history.json(since))
}
