// Package server is the whole outboxd service: its configuration (flags,
// OUTBOXD_* variables and YAML), the wiring of the store, the feeds, the
// relay and the HTTP API, signals and graceful shutdown. cmd/server is a
// thin main around Command; tests and the bench run Main in-process.
package server
