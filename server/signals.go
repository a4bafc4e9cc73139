package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// shutdown turns SIGINT and SIGTERM into a clean stop: the first cancels
// ctx (whatever the server is doing, starting included) and bounds the
// rest by the grace period; a second one exits at once.
type shutdown struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed by close: the command has returned

	mu       sync.Mutex
	signaled os.Signal // the first signal, nil before it
	logger   *slog.Logger
	grace    time.Duration
	timer    *time.Timer
}

// watchSignals starts watching sigs. Signals that arrive before the
// logger exists are remembered, and reported once arm gives it.
func watchSignals(sigs <-chan os.Signal, stderr io.Writer) *shutdown {
	ctx, cancel := context.WithCancel(context.Background())
	sd := &shutdown{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go func() {
		select {
		case s := <-sigs:
			sd.first(s)
		case <-sd.done:
			return
		}
		select {
		case s := <-sigs:
			fmt.Fprintf(stderr, "%s: second signal (%v): exiting at once\n", programName, s)
			os.Exit(128 + signalNumber(s))
		case <-sd.done:
		}
	}()
	return sd
}

// first records the first signal and cancels the context.
func (sd *shutdown) first(s os.Signal) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	sd.signaled = s
	sd.cancel()
	sd.startGrace()
}

// arm gives the logger and the grace period; from then on a signal is
// logged and its grace period enforced (at once, if one came before).
func (sd *shutdown) arm(logger *slog.Logger, grace time.Duration) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	sd.logger, sd.grace = logger, grace
	sd.startGrace()
}

// startGrace logs the shutdown and starts the grace timer, once both the
// signal and the logger are there. It runs under sd.mu.
func (sd *shutdown) startGrace() {
	if sd.signaled == nil || sd.logger == nil || sd.timer != nil {
		return
	}
	logger, grace := sd.logger, sd.grace
	logger.Info("shutting down: committing the batch in hand", "signal", sd.signaled.String(), "grace", grace)
	sd.timer = time.AfterFunc(grace, func() {
		logger.Error("shutdown grace period passed: exiting")
		os.Exit(ExitFailed)
	})
}

// close stops watching; the command is about to return its exit code.
func (sd *shutdown) close() {
	sd.mu.Lock()
	if sd.timer != nil {
		sd.timer.Stop()
	}
	sd.mu.Unlock()
	close(sd.done)
	sd.cancel()
}

func signalNumber(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 1
}
