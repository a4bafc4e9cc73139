// Package earlysignal catches SIGINT and SIGTERM from the first moments of
// the process: its initialiser runs right after the standard library's
// os/signal, before the heavy packages (Kafka clients, SQLite, Prometheus)
// initialise and long before main. Without it, a SIGTERM that arrives while
// the process is still starting ends it by the signal's default action.
//
// Only the binary imports it: a library user's process keeps its own
// signal handling.
package earlysignal

import (
	"os"
	"os/signal"
	"syscall"
)

// caught receives every SIGINT and SIGTERM from process start on. Its
// buffer holds more signals than anyone acts on (the first asks for a
// clean shutdown, the second for an immediate exit), so none is dropped.
var caught = make(chan os.Signal, 8)

func init() {
	signal.Notify(caught, syscall.SIGINT, syscall.SIGTERM)
}

// Signals returns the channel that has received every SIGINT and SIGTERM
// since the process started, in order. One consumer should read it.
func Signals() <-chan os.Signal { return caught }

// Release stops catching the signals and delivers the ones caught so far
// to the process again, so whatever handles them next (a handler
// installed later, or the default action) sees them. For subcommands that
// install their own handling.
func Release() {
	signal.Stop(caught)
	self, err := os.FindProcess(os.Getpid())
	if err != nil {
		return
	}
	for {
		select {
		case s := <-caught:
			self.Signal(s)
		default:
			return
		}
	}
}
