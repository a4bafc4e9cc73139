// Command server runs outboxd: it reads the configured feeds, applies each
// item exactly once to its processor's state in SQLite, and relays the
// outputs to Kafka.
//
//	server --feed ledger=file:./ledger.csv --processor ledger=ledger
//	server consume --brokers 127.0.0.1:9092 --topic ledger.out --from-beginning
//	server bench
package main

import (
	"os"

	"github.com/outboxd/outboxd/internal/bench"
	"github.com/outboxd/outboxd/server"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "bench" {
		os.Exit(bench.Command(args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(server.Command(args, os.Stdout, os.Stderr))
}
