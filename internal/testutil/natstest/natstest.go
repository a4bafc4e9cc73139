// Package natstest starts a real nats-server with JetStream for a test:
// on 127.0.0.1, a free port, its own store directory, killed at the end.
package natstest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testutil"
)

// Binary finds nats-server: $OUTBOXD_NATS_SERVER, the PATH, then
// /usr/sbin/nats-server (Debian's package); "" when there is none.
func Binary() string {
	if p := os.Getenv("OUTBOXD_NATS_SERVER"); p != "" {
		return p
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nats-server"); err == nil {
		return "/usr/sbin/nats-server"
	}
	return ""
}

// Server is a nats-server the test started.
type Server struct {
	tb   testing.TB
	bin  string
	Port int
	Dir  string // its JetStream store directory

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
	out    *testutil.SyncBuffer
}

// Start starts a nats-server with JetStream, skipping the test (one line)
// when the binary is missing. It is killed when the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		tb.Skip("nats-server not found (apt-get install nats-server, or set OUTBOXD_NATS_SERVER)")
	}
	s := &Server{tb: tb, bin: bin, Port: freePort(tb), Dir: filepath.Join(tb.TempDir(), "js")}
	s.Restart()
	tb.Cleanup(s.Stop)
	return s
}

// URL is the server's nats:// URL.
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.Port) }

// Restart starts the server (again), on the same port and store, and
// waits until it takes connections.
func (s *Server) Restart() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.tb.Fatal("natstest: Restart while running")
	}
	out := &testutil.SyncBuffer{}
	cmd := exec.Command(s.bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-sd", s.Dir)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("start nats-server: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			s.tb.Fatalf("nats-server exited: %v\n%s", err, out.String())
		default:
		}
		c, err := net.DialTimeout("tcp", s.addr(), time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			s.tb.Fatalf("nats-server not listening on %s after 20s\n%s", s.addr(), out.String())
		}
		time.Sleep(testutil.PollInterval)
	}
	s.cmd, s.exited, s.out = cmd, exited, out
}

// Stop kills the server (SIGKILL: what it has not synced is lost, as in
// a crash) and waits for it to exit. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
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

func (s *Server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// freePort is a port free on 127.0.0.1 a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Process is the running server's process (nil when stopped), for a test
// that stops it (SIGSTOP) and lets it go on.
func (s *Server) Process() *os.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.cmd.Process
}
