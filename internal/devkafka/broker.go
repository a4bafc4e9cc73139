// Package devkafka holds the Kafka tools of development and tests: the
// in-process dev broker (kfake) and the read_committed reader behind
// `server consume`. The relay and the feeds never import it.
package devkafka

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultAddr is where Start listens when given no address.
const DefaultAddr = "127.0.0.1:9092"

// Broker is an in-process, single-broker Kafka for development and
// tests: franz-go's kfake, which speaks the real protocol, transactions,
// idempotence and read_committed included. It keeps everything in memory:
// its topics vanish with it.
type Broker struct {
	c    *kfake.Cluster
	addr string
}

// Start starts a dev broker listening on addr (DefaultAddr
// when empty; port 0 picks a free one). The listener is opened first, so an
// address in use fails here. The broker advertises the address it listens
// on: give a host clients can reach (127.0.0.1, not 0.0.0.0). logger may be
// nil; the broker's request logs go to it at debug level.
func Start(addr string, logger *slog.Logger) (*Broker, error) {
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dev broker: listen on %s: %w", addr, err)
	}
	return StartOn(ln, logger)
}

// Addr is the host:port the broker listens on and advertises.
func (b *Broker) Addr() string { return b.addr }

// Close stops the broker and drops its data. It always returns nil.
func (b *Broker) Close() error {
	b.c.Close()
	return nil
}

// kfakeLogger sends kfake's logs to slog: its errors and warnings as such,
// its per-request info and debug lines at debug level.
type kfakeLogger struct{ l *slog.Logger }

func (k kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	sl := slog.LevelDebug
	switch level {
	case kfake.LogLevelError:
		sl = slog.LevelError
	case kfake.LogLevelWarn:
		sl = slog.LevelWarn
	case kfake.LogLevelNone:
		return
	}
	if !k.l.Enabled(context.Background(), sl) {
		return
	}
	k.l.Log(context.Background(), sl, fmt.Sprintf(format, args...))
}
