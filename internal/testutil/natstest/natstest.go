// Package natstest starts a real nats-server with JetStream for a test:
// on 127.0.0.1, a free port, its own store directory, killed at the end.
// It is internal/natsserver with a test's failures and clean-up.
package natstest

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/outboxd/outboxd/internal/natsserver"
	"github.com/outboxd/outboxd/internal/testutil"
)

// Binary finds nats-server: $OUTBOXD_NATS_SERVER, the PATH, then
// /usr/sbin/nats-server (Debian's package); "" when there is none.
func Binary() string { return natsserver.Binary() }

// Server is a nats-server the test started.
type Server struct {
	tb   testing.TB
	bin  string
	Port int
	Dir  string // its JetStream store directory

	mu  sync.Mutex
	srv *natsserver.Server
	out *testutil.SyncBuffer
}

// Start starts a nats-server with JetStream, skipping the test (one line)
// when the binary is missing. It is killed when the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		tb.Skip(natsserver.Missing)
	}
	port, err := natsserver.FreePort()
	testutil.Must(tb, err)
	s := &Server{tb: tb, bin: bin, Port: port, Dir: filepath.Join(tb.TempDir(), "js")}
	s.Restart()
	tb.Cleanup(s.Stop)
	return s
}

// URL is the server's nats:// URL.
func (s *Server) URL() string { return natsserver.URL(s.Port) }

// Restart starts the server (again), on the same port and store, and
// waits until it takes connections.
func (s *Server) Restart() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.tb.Fatal("natstest: Restart while running")
	}
	out := &testutil.SyncBuffer{}
	srv, err := natsserver.Start(context.Background(), s.bin, s.Port, s.Dir, out)
	if err != nil {
		s.tb.Fatalf("%v\n%s", err, out.String())
	}
	s.srv, s.out = srv, out
}

// Stop kills the server (SIGKILL: what it has not synced is lost, as in
// a crash) and waits for it to exit. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Kill()
	s.srv = nil
}

// Output is what the server printed.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// Process is the running server's process (nil when stopped), for a test
// that stops it (SIGSTOP) and lets it go on.
func (s *Server) Process() *os.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return nil
	}
	return s.srv.Process()
}
