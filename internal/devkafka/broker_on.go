package devkafka

import (
	"fmt"
	"log/slog"
	"net"

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
	if o.DataDir != "" {
		// Every produce is synced: a dev broker that lost records a
		// server counts as published would look like a loss of outboxd's.
		opts = append(opts, kfake.DataDir(o.DataDir), kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(append(opts, o.Extra...)...)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("dev broker: %w", err)
	}
	return &Broker{c: c, addr: ln.Addr().String(), dataDir: o.DataDir}, nil
}
