package server

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/outbox"
)

// logSummary writes the one line that says what runs, at INFO: the feeds
// with their sources, processors and topics, the database, the relay and
// its brokers, and the HTTP address. A warning follows when
// synchronous=normal is in use (the dev broker warned when it started).
// Then it warns of each file feed whose file is in the database's
// directory.
func (m *Main) logSummary(ctx context.Context) {
	attrs := summary(m.Config, m.Broker != nil, m.URL())
	if len(m.Config.Brokers) > 0 {
		attrs = append(attrs, slog.String("kafka_security", m.Config.Kafka.Settings.Describe()))
	}
	if !m.backlog.IsZero() {
		attrs = append(attrs, slog.Int64("max_backlog_bytes", m.backlog.Bytes), slog.Int64("max_backlog_rows", m.backlog.Rows),
			slog.String("backlog_bound", m.backlogHow))
	}
	m.Logger.LogAttrs(ctx, slog.LevelInfo, "outboxd running", attrs...)
	if m.Config.Synchronous == outbox.SyncNormal {
		m.Logger.Warn("synchronous=normal: a commit survives a process crash, not a power loss", "db", m.Config.shownDB())
	}
	for _, name := range slices.Sorted(maps.Keys(m.Config.Feeds)) {
		if kind, target, _ := strings.Cut(m.Config.Feeds[name].Source, ":"); kind == "file" {
			m.warnSharedDir(name, target)
		}
	}
}

// summary is the start-up line's attributes for cfg.
func summary(cfg Config, devBroker bool, url string) []slog.Attr {
	feeds := make([]string, 0, len(cfg.Feeds))
	for _, name := range cfg.FeedNames() {
		f := cfg.Feeds[name]
		feeds = append(feeds, fmt.Sprintf("%s: %s -> %s -> %s", name, f.Source, f.Processor, f.Topic))
	}
	brokers := strings.Join(cfg.Brokers, ",")
	if devBroker {
		brokers = "dev broker " + cfg.DevBroker.Addr
	}
	return []slog.Attr{
		slog.String("feeds", strings.Join(feeds, "; ")),
		slog.String("db", cfg.shownDB()),
		slog.String("synchronous", string(cfg.Synchronous)),
		slog.String("relay", cfg.Relay.Mode),
		slog.String("brokers", brokers),
		slog.String("http", url),
	}
}
