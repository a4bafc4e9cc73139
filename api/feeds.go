package api

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/outboxd/outboxd/outbox"
)

// FeedSummary is one feed in GET /feeds: its state in a few fields and in
// one line of text.
type FeedSummary struct {
	Feed               string           `json:"feed"`
	Kind               string           `json:"kind"`
	Source             string           `json:"source"`
	Processor          string           `json:"processor"`
	State              outbox.FeedState `json:"state"`
	Configured         bool             `json:"configured"`
	Position           int64            `json:"position"`
	End                int64            `json:"end"`
	Lag                int64            `json:"lag"`
	Applied            int64            `json:"applied"`
	DeadLettered       int64            `json:"deadLettered"`
	CompletionFailures int64            `json:"completionFailures"`
	Lossless           bool             `json:"lossless"`
	LastError          string           `json:"lastError"`
	// Line is the state as one line of text, for people.
	Line string `json:"line"`
}

// FeedList is the body of GET /feeds.
type FeedList struct {
	Feeds []FeedSummary `json:"feeds"`
}

func summarize(fs FeedStatus) FeedSummary {
	return FeedSummary{
		Feed: fs.Feed, Kind: fs.Kind, Source: fs.Source, Processor: fs.Processor, State: fs.State,
		Configured: fs.Configured, Position: fs.Position, End: fs.End, Lag: fs.Lag,
		Applied: fs.Applied, DeadLettered: fs.DeadLettered, CompletionFailures: fs.CompletionFailures,
		Lossless: fs.Lossless, LastError: fs.LastError, Line: line(fs),
	}
}

// line renders "caught-up at 120/120 (lag 0), 7 applied, 1 dead-lettered,
// lossless".
func line(fs FeedStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s at %d/%d (lag %d), %d applied, %d dead-lettered", fs.State, fs.Position, fs.End, fs.Lag,
		fs.Applied, fs.DeadLettered)
	if fs.CompletionFailures > 0 {
		fmt.Fprintf(&b, ", %d completion failures", fs.CompletionFailures)
	}
	if fs.Lossless {
		b.WriteString(", lossless")
	} else {
		fmt.Fprintf(&b, ", NOT LOSSLESS (%d losses)", fs.LossCount)
	}
	if fs.LastError != "" {
		fmt.Fprintf(&b, "; last error: %s", fs.LastError)
	}
	return b.String()
}

// handleFeeds serves GET /feeds.
func (s *Server) handleFeeds(w http.ResponseWriter, r *http.Request) {
	statuses, err := s.feedStatuses(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list := FeedList{Feeds: make([]FeedSummary, 0, len(statuses))}
	for _, fs := range statuses {
		list.Feeds = append(list.Feeds, summarize(fs))
	}
	writeJSON(w, http.StatusOK, list)
}

// handleFeedStatus serves GET /feeds/{name}/status.
func (s *Server) handleFeedStatus(w http.ResponseWriter, r *http.Request) {
	fs, err := s.feedStatus(r.Context(), chi.URLParam(r, "name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fs)
}
