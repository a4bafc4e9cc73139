// Package natsserver starts a nats-server binary with JetStream on
// 127.0.0.1, its store in a directory of its own, and kills it: the one
// way outboxd's bench (server bench --nats) and its tests
// (internal/testutil/natstest) run a real NATS server.
package natsserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/internal/clock"
)

// EnvBinary names the nats-server binary to use, before the PATH.
const EnvBinary = "OUTBOXD_NATS_SERVER"

// Missing is what to say when Binary finds none.
const Missing = "nats-server not found (apt-get install nats-server, or set " + EnvBinary + ")"

// readyWithin bounds the wait for a started server to take connections,
// and readyPoll is how often Start tries to connect meanwhile.
const (
	readyWithin = 20 * time.Second
	readyPoll   = 20 * time.Millisecond
)

// Binary finds nats-server: $OUTBOXD_NATS_SERVER, the PATH, then
// /usr/sbin/nats-server (Debian's package); "" when there is none.
func Binary() string {
	if p := os.Getenv(EnvBinary); p != "" {
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

// FreePort is a port free on 127.0.0.1 a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL is the nats:// URL of a server on 127.0.0.1:port.
func URL(port int) string { return "nats://127.0.0.1:" + strconv.Itoa(port) }

// Server is a running nats-server. Its methods are not safe for
// concurrent use.
type Server struct {
	cmd    *exec.Cmd
	exited chan error
}

// Start runs bin with JetStream on 127.0.0.1:port, its store in dir, its
// output to out (nil: discarded), and returns once it takes connections.
// It fails, the process killed, when the server exits first, when ctx
// ends, or when it is not listening within 20 seconds.
func Start(ctx context.Context, bin string, port int, dir string, out io.Writer) (*Server, error) {
	cmd := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", dir)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nats-server: %w", err)
	}
	s := &Server{cmd: cmd, exited: make(chan error, 1)}
	go func() { s.exited <- cmd.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(readyWithin)
	for {
		select {
		case err := <-s.exited:
			return nil, fmt.Errorf("nats-server exited: %v", err)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Kill()
			return nil, fmt.Errorf("nats-server not listening on %s after %v", addr, readyWithin)
		}
		if err := clock.Sleep(ctx, readyPoll); err != nil {
			s.Kill()
			return nil, fmt.Errorf("wait for nats-server on %s: %w", addr, err)
		}
	}
}

// Kill kills the server (SIGKILL: what it has not synced is lost, as in a
// crash) and waits for it to exit.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Process is the server's process, for a caller that stops it (SIGSTOP)
// and lets it go on.
func (s *Server) Process() *os.Process { return s.cmd.Process }
