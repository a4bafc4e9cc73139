package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/devkafka"
)

// envBenchBroker, set in its environment, makes `server bench` the bench's
// dev broker: it prints its address and serves until its stdin closes.
const envBenchBroker = "OUTBOXD_BENCH_BROKER_CHILD"

// brokerStartTimeout bounds how long the child broker takes to listen.
const brokerStartTimeout = 15 * time.Second

// benchBroker is the dev broker (kfake) of a run without --brokers. It runs
// in a child process, the same binary, so that the bench's memory figures
// are outboxd's alone: the broker keeps every record in memory.
type benchBroker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	// inProcess is set instead when no child could be started.
	inProcess *devkafka.Broker
}

// connect finds the brokers: --brokers, or a dev broker of the run's own.
func (b *bench) connect(ctx context.Context) error {
	if len(b.o.Brokers) > 0 {
		b.brokers = b.o.Brokers
		b.res.Settings.Broker = "brokers " + strings.Join(b.o.Brokers, ",")
		return nil
	}
	br, err := startChildBroker(ctx)
	if err != nil {
		b.say("no child broker (%v): using an in-process dev broker; memory figures include it", err)
		dev, derr := devkafka.Start("127.0.0.1:0", b.log)
		if derr != nil {
			return fmt.Errorf("start the dev broker: %w", derr)
		}
		b.broker = &benchBroker{inProcess: dev, addr: dev.Addr()}
		b.res.Settings.Broker = "dev broker (in-process)"
	} else {
		b.broker = br
		b.res.Settings.Broker = "dev broker (child process)"
	}
	b.brokers = []string{b.broker.addr}
	return nil
}

// startChildBroker starts this binary as a dev broker and reads its address.
func startChildBroker(ctx context.Context) (*benchBroker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program: %w", err)
	}
	cmd := exec.Command(exe, "bench")
	cmd.Env = append(os.Environ(), envBenchBroker+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("child broker: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("child broker: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child broker: %w", err)
	}
	br := &benchBroker{cmd: cmd, stdin: stdin}
	if br.addr, err = readAddr(ctx, stdout); err != nil {
		br.close()
		return nil, fmt.Errorf("child broker: %w", err)
	}
	return br, nil
}

// readAddr reads the child's first line, its address.
func readAddr(ctx context.Context, r io.Reader) (string, error) {
	ch := make(chan string, 1)
	go func() {
		br := bufio.NewReader(r)
		line, _ := br.ReadString('\n')
		ch <- strings.TrimSpace(line)
		io.Copy(io.Discard, br) // nothing more is expected; keep the pipe drained
	}()
	t := time.NewTimer(brokerStartTimeout)
	defer t.Stop()
	select {
	case addr := <-ch:
		if addr == "" {
			return "", errors.New("exited without an address")
		}
		return addr, nil
	case <-t.C:
		return "", fmt.Errorf("no address within %v", brokerStartTimeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// brokerPID is the broker child's process id, 0 when there is none (a
// given cluster, or a broker in this process).
func (b *bench) brokerPID() int {
	if b.broker == nil || b.broker.cmd == nil || b.broker.cmd.Process == nil {
		return 0
	}
	return b.broker.cmd.Process.Pid
}

// peakMiB is the child's peak resident memory (0 when unknown or in-process).
func (br *benchBroker) peakMiB() float64 {
	if br.cmd == nil || br.cmd.Process == nil {
		return 0
	}
	v, err := readStatusMiB("/proc/"+strconv.Itoa(br.cmd.Process.Pid)+"/status", "VmHWM")
	if err != nil {
		return 0
	}
	return v
}

// close stops the broker: closing its stdin ends the child, which is
// killed if it has not exited within a few seconds.
func (br *benchBroker) close() error {
	if br.inProcess != nil {
		return br.inProcess.Close()
	}
	br.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- br.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("child broker: %w", err)
		}
		return nil
	case <-time.After(5 * time.Second):
		br.cmd.Process.Kill()
		<-done
		return errors.New("child broker: did not exit; killed")
	}
}

// benchBrokerChild is the child's side: a dev broker on a free port whose
// address goes to stdout, serving until stdin is closed (the parent closed
// it, or died).
func benchBrokerChild(stdin io.Reader, stdout, stderr io.Writer) int {
	b, err := devkafka.Start("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Fprintf(stderr, "bench broker: %v\n", err)
		return 1
	}
	defer b.Close()
	if _, err := fmt.Fprintln(stdout, b.Addr()); err != nil {
		return 1
	}
	io.Copy(io.Discard, stdin)
	return 0
}
