// Package server is the whole outboxd service: its configuration (flags,
// OUTBOXD_* variables and YAML), the wiring of the store, the feeds, the
// relay and the HTTP API, signals and graceful shutdown. cmd/server is a
// thin main around CommandSignals; tests and the bench run Main in-process.
//
// The service as a library: a program of its own runs exactly what the
// server binary runs (the same flags, environment, YAML, subcommands,
// feeds, relay, API, signals and exit codes) with processors of its own,
// each registered by name with WithProcessor:
//
//	func main() {
//		os.Exit(server.Run(server.WithProcessor("counter", func(s server.ProcessorSpec) (ingest.Processor, error) {
//			return &Counter{topic: s.Topic}, nil
//		})))
//	}
//
// --processor FEED=counter (feeds.FEED.processor: counter) then makes
// the feed's processor with that factory, once per feed at start, told
// the feed's name, output topic, source and the service's logger
// (ProcessorSpec). The built-in processors (ledger, forward, orders) are
// registered the same way, before the caller's, so a caller may also
// replace one; a name no one registered is a one-line error naming the
// registered ones, exit code 2.
package server
