package devkafka

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/twmb/franz-go/pkg/kfake"
)

// StartOn starts a dev broker serving ln, which it closes on Close.
// The broker advertises ln.Addr(): a listener that reports another address
// (a proxy's) makes every client connect through it.
func StartOn(ln net.Listener, logger *slog.Logger) (*Broker, error) {
	if logger == nil {
		logger = slog.Default()
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.ListenFn(func(string, string) (net.Listener, error) { return ln, nil }),
		kfake.DefaultNumPartitions(3),
		kfake.WithLogger(kfakeLogger{logger.With("component", "devbroker")}),
	)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("dev broker: %w", err)
	}
	return &Broker{c: c, addr: ln.Addr().String()}, nil
}
