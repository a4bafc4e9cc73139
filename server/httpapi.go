package server

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// apiFeed adapts an ingest loop to api.Feed.
type apiFeed struct {
	l      *ingest.Loop
	topics []string
}

var (
	_ api.Feed       = apiFeed{}
	_ api.FeedTopics = apiFeed{}
)

// Topics are the feed's output topics.
func (f apiFeed) Topics() []string { return f.topics }

func (f apiFeed) Name() string                      { return f.l.Name() }
func (f apiFeed) Kind() string                      { return f.l.Feed().Kind() }
func (f apiFeed) Source() string                    { return f.l.Feed().Source() }
func (f apiFeed) Processor() string                 { return f.l.Processor() }
func (f apiFeed) State() (outbox.FeedState, string) { return f.l.State() }
func (f apiFeed) Ends() map[int32]int64             { return f.l.Feed().Ends() }
func (f apiFeed) Requeue(ctx context.Context, id int64, r outbox.Requeue) (bool, error) {
	return f.l.RequeueWith(ctx, id, r)
}

// apiRelay adapts the relay to api.Relay.
type apiRelay struct{ r *relay.Relay }

func (a apiRelay) Status() api.RelayStatus {
	return a.r.Status()
}

// newAPI makes the HTTP API; open serves it on the port preflight bound.
func (m *Main) newAPI() error {
	cfg := api.DefaultConfig()
	cfg.Addr, cfg.AdminToken, cfg.TLS = m.Config.HTTP, m.Config.AdminToken, m.Config.HTTPTLS.TLS
	cfg.Tokens = m.Config.APITokens.Tokens
	cfg.BatchMax, cfg.RelayBatchMax = m.Config.BatchMax, m.Config.Relay.Batch
	cfg.MaxBacklog = m.backlog
	cfg.Queries, cfg.QueryLimits = m.queries, m.Config.Query.limits()
	cfg.Starting = m.startingReason
	feeds := make([]api.Feed, 0, len(m.Loops))
	for _, l := range m.Loops {
		feeds = append(feeds, apiFeed{l: l, topics: m.Config.Feeds[l.Name()].topics(l.Name())})
	}
	var r api.Relay // a nil interface when the relay is off, not a nil *relay.Relay
	if m.Relay != nil {
		r = apiRelay{m.Relay}
	}
	srv, err := api.New(cfg, m.Store, feeds, r, m.Logger)
	if err != nil {
		return err
	}
	if m.needsKafka() {
		srv.SetKafka(newKafkaTopics(m))
	}
	if len(m.Sinks) > 0 {
		srv.SetSinks(m.SinkStatuses)
	}
	m.API = srv
	return nil
}

func (m *Main) closeAPI() error {
	if m.API == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return m.API.Close(ctx)
}
