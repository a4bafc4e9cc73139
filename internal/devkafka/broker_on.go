package devkafka

import (
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/twmb/franz-go/pkg/kfake"
)

// StartOn starts an in-memory dev broker serving ln, which it closes on
// Close. The broker advertises ln.Addr(): a listener that reports another
// address (a proxy's) makes every client connect through it.
func StartOn(ln net.Listener, logger *slog.Logger) (*Broker, error) {
	return StartOnWith(ln, Options{Logger: logger})
}

// StartOnWith starts a dev broker serving ln as o says (o.Addr is unused).
func StartOnWith(ln net.Listener, o Options) (*Broker, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	parts := o.Partitions
	if parts <= 0 {
		parts = 3
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ListenFn(func(string, string) (net.Listener, error) { return ln, nil }),
		kfake.DefaultNumPartitions(parts),
		kfake.WithLogger(kfakeLogger{logger.With("component", "devbroker")}),
	}
	if o.AutoCreateTopics {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	var gate *gatedListener
	if o.DataDir != "" {
		// Every produce is synced: a dev broker that lost records a
		// server counts as published would look like a loss of outboxd's.
		opts = append(opts, kfake.DataDir(o.DataDir), kfake.SyncWrites())
		if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
			ln.Close()
			return nil, fmt.Errorf("dev broker: %w", err)
		}
		if err := recoverTxns(o.DataDir, logger.With("component", "devbroker")); err != nil {
			ln.Close()
			return nil, fmt.Errorf("dev broker: %w", err)
		}
		// No client is served before the transaction log follows
		// every EndTxn.
		gate = &gatedListener{Listener: ln, open: make(chan struct{})}
		opts = append(opts, kfake.ListenFn(func(string, string) (net.Listener, error) { return gate, nil }))
	}
	c, err := kfake.NewCluster(append(opts, o.Extra...)...)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("dev broker: %w", err)
	}
	b := &Broker{c: c, addr: ln.Addr().String(), dataDir: o.DataDir}
	if gate != nil {
		if b.txns, err = openTxnLog(o.DataDir, logger.With("component", "devbroker")); err != nil {
			close(gate.open)
			c.Close()
			return nil, fmt.Errorf("dev broker: %w", err)
		}
		b.txns.install(c)
		close(gate.open)
	}
	return b, nil
}

// gatedListener accepts no connection until open is closed.
type gatedListener struct {
	net.Listener
	open chan struct{}
}

func (g *gatedListener) Accept() (net.Conn, error) {
	<-g.open
	return g.Listener.Accept()
}
