package relay

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultDevBrokerAddr is where StartDevBroker listens when given no address.
const DefaultDevBrokerAddr = "127.0.0.1:9092"

// DevBroker is an in-process, single-broker Kafka for development and
// tests: franz-go's kfake, which speaks the real protocol, transactions,
// idempotence and read_committed included. It keeps everything in memory:
// its topics vanish with it.
type DevBroker struct {
	c    *kfake.Cluster
	addr string
}

// StartDevBroker starts a dev broker listening on addr (DefaultDevBrokerAddr
// when empty; port 0 picks a free one). The listener is opened first, so an
// address in use fails here. The broker advertises the address it listens
// on: give a host clients can reach (127.0.0.1, not 0.0.0.0). logger may be
// nil; the broker's request logs go to it at debug level.
func StartDevBroker(addr string, logger *slog.Logger) (*DevBroker, error) {
	if addr == "" {
		addr = DefaultDevBrokerAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dev broker: listen on %s: %w", addr, err)
	}
	return StartDevBrokerOn(ln, logger)
}

// Addr is the host:port the broker listens on and advertises.
func (b *DevBroker) Addr() string { return b.addr }

// Close stops the broker and drops its data. It always returns nil.
func (b *DevBroker) Close() error {
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
