package api

import (
	_ "embed" // openapi.yaml
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outboxd/outbox"
)

// OpenAPI is the API's OpenAPI 3 description, served at /openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// routes builds the router: every request goes through recovery, logging
// and the body cap; the mutating endpoints also through adminOnly.
func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(s.recoverer, s.logRequests, s.limitBody)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such endpoint: "+r.URL.Path)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path)
	})

	r.Get("/", s.handleDashboard)
	r.Get("/dashboard/*", s.handleDashboardAsset)
	r.Get("/openapi.yaml", handleOpenAPI)
	r.Get("/healthz", s.handleHealthz)
	r.Get("/readyz", s.handleReadyz)
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{
		ErrorHandling: promhttp.HTTPErrorOnError,
		ErrorLog:      slogPrinter{s},
	}))

	r.Get("/status", s.handleOverview)
	r.Get("/history", s.handleHistory)
	r.Get("/topics", s.handleTopics)
	r.Get("/topics/{name}", s.handleTopic)
	r.Get("/feeds", s.handleFeeds)
	r.Get("/cluster", s.handleCluster)
	r.Get("/outbox/status", s.handleOutboxStatus)
	r.Get("/sinks", s.handleSinks)
	r.Get("/queries", s.handleQueries)
	r.Get("/queries/{name}", s.handleQuery)
	r.Route("/feeds/{name}", func(r chi.Router) {
		r.Get("/status", s.handleFeedStatus)
		r.Group(func(r chi.Router) {
			r.Use(s.readToken)
			r.Get("/dead-letters", s.handleDeadLetters)
			r.Get("/dead-letters/{id}", s.handleDeadLetter)
			r.Get("/dead-letters/{id}/key", s.handleDeadLetterPart(outbox.PartKey))
			r.Get("/dead-letters/{id}/payload", s.handleDeadLetterPart(outbox.PartPayload))
		})
		r.Group(func(r chi.Router) {
			r.Use(s.adminOnly)
			r.Post("/dead-letters/{id}/requeue", s.handleRequeue)
			r.Post("/dead-letters/{id}/discard", s.handleDiscard)
			r.Post("/dead-letters/requeue", s.handleRequeueAll)
			r.Post("/dead-letters/discard", s.handleDiscardAll)
			r.Post("/losses/ack", s.handleAckLosses)
		})
	})
	return r
}

func handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Write(OpenAPI)
}

// slogPrinter adapts the server's logger to promhttp's error log.
type slogPrinter struct{ s *Server }

func (p slogPrinter) Println(v ...any) {
	p.s.log.Error("metrics handler", logKeyErr, v)
}
