// Command server runs outboxd: it reads the configured feeds, applies each
// item exactly once to its processor's state in SQLite, and relays the
// outputs to Kafka.
//
//	outboxd --feed ledger=file:./ledger.csv --processor ledger=ledger
//	outboxd consume --brokers 127.0.0.1:9092 -t ledger.out -o beginning -e
//	outboxd bench
//
// Help and errors name the program as it was run (the base of os.Args[0]).
package main

import (
	"os"

	"github.com/outboxd/outboxd/cmd/server/internal/bench"
	"github.com/outboxd/outboxd/internal/earlysignal"
	"github.com/outboxd/outboxd/server"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "bench" {
		earlysignal.Release() // the bench handles its own signals
		os.Exit(bench.Command(args[1:], os.Stdout, os.Stderr))
	}
	// SIGINT and SIGTERM are caught since the earliest initialiser
	// (earlysignal): one that arrives while the server starts stops it
	// cleanly instead of killing it.
	os.Exit(server.CommandSignals(args, os.Stdout, os.Stderr, earlysignal.Signals()))
}
