// Package devkafka holds the Kafka tools of development and tests: the
// in-process dev broker (kfake), and the clients behind `server consume`
// (a read_committed reader) and `server produce`. The relay and the feeds
// never import it.
package devkafka

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultAddr is where Start listens when given no address.
const DefaultAddr = "127.0.0.1:9092"

// Broker is an in-process, single-broker Kafka for development and
// tests: franz-go's kfake, which speaks the real protocol, transactions,
// idempotence and read_committed included. It keeps its log in memory, or
// in a data directory that a later broker reloads (Options.DataDir).
type Broker struct {
	c       *kfake.Cluster
	addr    string
	dataDir string
	txns    *txnLog // with a data directory: its transaction log
}

// Options configures a dev broker. The zero value is an in-memory broker on
// DefaultAddr that creates no topic by itself.
type Options struct {
	// Addr is where it listens (DefaultAddr when empty; port 0 picks a
	// free one). It advertises this address: give a host clients can
	// reach (127.0.0.1, not 0.0.0.0).
	Addr string
	// DataDir, when set, is where the broker keeps its log, synced at
	// every produce, so records survive a restart (even after kill -9) and
	// a broker started on the same directory serves them again. Empty:
	// memory only.
	DataDir string
	// AutoCreateTopics creates a topic the first time a client asks for
	// it (a producer, kcat -P), with Partitions partitions.
	AutoCreateTopics bool
	// Partitions of the topics it creates when a client does not say
	// (default 3).
	Partitions int
	// Logger gets the broker's logs, its request logs at debug level
	// (default slog.Default()).
	Logger *slog.Logger
	// Extra options for the cluster (TLS, SASL, ACLs in tests).
	Extra []kfake.Opt
}

// Start starts an in-memory dev broker listening on addr (see
// Options.Addr). The listener is opened first, so an address in use fails
// here. logger may be nil.
func Start(addr string, logger *slog.Logger) (*Broker, error) {
	return StartWith(Options{Addr: addr, Logger: logger})
}

// StartWith starts a dev broker as o says. The listener is opened first, so
// an address in use fails here.
func StartWith(o Options) (*Broker, error) {
	addr := o.Addr
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dev broker: listen on %s: %w", addr, err)
	}
	return StartOnWith(ln, o)
}

// DataDir is the directory the broker keeps its log in ("" for memory only).
func (b *Broker) DataDir() string { return b.dataDir }

// Addr is the host:port the broker listens on and advertises.
func (b *Broker) Addr() string { return b.addr }

// Close stops the broker: an in-memory broker drops its data, one with a
// data directory writes what it holds there. It always returns nil.
func (b *Broker) Close() error {
	b.c.Close()
	if b.txns != nil {
		b.txns.close()
	}
	return nil
}

// kfakeLogger sends kfake's logs to slog: its errors and the warnings that
// are real problems (a write or a read of its log failing, damage found on
// disk) as such, the warnings that note a client's timing (quietLevels)
// below WARN, its per-request info and debug lines at debug level.
type kfakeLogger struct{ l *slog.Logger }

// quietLevels gives the level of kfake's warnings that are no operator's
// business, by the start of their format: an EndTxn taking over 5 ms (each
// of its markers is synced), a transaction its producer let time out (the
// producer reports it), and the consumer-group timings of a client.
var quietLevels = []struct {
	prefix string
	level  slog.Level
}{
	{"txn: EndTxn slow", slog.LevelDebug},
	{"consumerHeartbeatLate", slog.LevelDebug},
	{"txn timeout abort", slog.LevelInfo},
	{"consumerRebalanceTimeout", slog.LevelInfo},
	{"consumerSessionTimeout", slog.LevelInfo},
	{"OffsetCommit STALE", slog.LevelInfo},
}

// level is the slog level of a kfake line.
func (kfakeLogger) level(level kfake.LogLevel, format string) (slog.Level, bool) {
	switch level {
	case kfake.LogLevelError:
		return slog.LevelError, true
	case kfake.LogLevelWarn:
		for _, q := range quietLevels {
			if strings.HasPrefix(format, q.prefix) {
				return q.level, true
			}
		}
		return slog.LevelWarn, true
	case kfake.LogLevelNone:
		return 0, false
	}
	return slog.LevelDebug, true
}

func (k kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	sl, ok := k.level(level, format)
	if !ok || !k.l.Enabled(context.Background(), sl) {
		return
	}
	k.l.Log(context.Background(), sl, fmt.Sprintf(format, args...))
}
