package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/server"
)

// envBenchServer, set in its environment, makes `server bench ARGS` run
// `server ARGS`: the bench's engine phases run the server itself, in a
// child process, so that what they measure is what users run, and its CPU
// time and memory are its own.
const envBenchServer = "OUTBOXD_BENCH_SERVER_CHILD"

// envBenchProfile, set beside envBenchServer, names the file the child
// writes a CPU profile of its whole run to (--cpuprofile).
const envBenchProfile = "OUTBOXD_BENCH_SERVER_CPUPROFILE"

// childEnv is the environment of a child running the server: the bench's
// own without OUTBOXD_ settings, and with --cpuprofile, where its profile
// of phase goes.
func (b *bench) childEnv(phase string) []string {
	env := append(serverEnv(os.Environ()), envBenchServer+"=1")
	if b.o.CPUProfile != "" && phase != "" {
		env = append(env, envBenchProfile+"="+b.o.CPUProfile+"."+phase+".server")
	}
	return env
}

// runServerChild is the child's side: `server ARGS`, profiled when the
// bench asked for it.
func runServerChild(args []string, stdout, stderr io.Writer) int {
	path := os.Getenv(envBenchProfile)
	if path == "" {
		return server.Command(args, stdout, stderr)
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(stderr, "bench: cpu profile: %v\n", err)
		return 1
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(stderr, "bench: cpu profile: %v\n", err)
		return 1
	}
	defer pprof.StopCPUProfile()
	return server.Command(args, stdout, stderr)
}

// benchFeed is the feed name of every engine phase (each has its own
// database).
const benchFeed = "bench"

// serverStopTimeout bounds a graceful stop (SIGTERM: the batch in hand is
// committed) before the child is killed.
const serverStopTimeout = 30 * time.Second

// engineSpec is what one engine phase runs.
type engineSpec struct {
	db     string
	source string   // "file:PATH" or "kafka:TOPIC"
	topic  string   // the feed's output topic
	relay  string   // exactly-once or none
	extra  []string // more of the server's flags (--record DIR)
}

// serverArgs is the server's command line for s, with the bench's settings.
func (b *bench) serverArgs(s engineSpec) []string {
	o := b.o
	level := "error"
	if o.Verbose {
		level = "info"
	}
	a := []string{
		"--db", s.db, "--http", "127.0.0.1:0",
		"--feed", benchFeed + "=" + s.source,
		"--processor", benchFeed + "=" + o.Processor,
		"--topic", benchFeed + "=" + s.topic,
		"--synchronous", o.Synchronous,
		"--batch-max", strconv.Itoa(o.BatchMax), "--batch-wait", o.BatchWait.String(),
		"--relay", s.relay,
		"--relay-batch", strconv.Itoa(o.RelayBatch), "--relay-wait", o.RelayWait.String(),
		"--progress-topic", b.topic("progress"),
		"--log-level", level,
	}
	if s.relay != "none" || strings.HasPrefix(s.source, "kafka:") {
		a = append(a, "--brokers", strings.Join(b.brokers, ","))
	}
	return append(a, s.extra...)
}

// serverProc is the server running in a child process.
type serverProc struct {
	cmd   *exec.Cmd
	start time.Time
	done  chan struct{} // closed when it has exited
	err   error         // its exit, once done
	logs  *tailBuffer
	cpu   cpuSpan
}

// startServer starts the server with args.
func (b *bench) startServer(args []string) (*serverProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program: %w", err)
	}
	p := &serverProc{done: make(chan struct{}), logs: &tailBuffer{max: 64 << 10}}
	p.cmd = exec.Command(exe, append([]string{"bench"}, args...)...)
	p.cmd.Env = b.childEnv(b.phase)
	p.cmd.Stderr = p.logs
	if b.o.Verbose {
		p.cmd.Stderr = multiWriter{p.logs, os.Stderr}
	}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the server: %w", err)
	}
	p.cpu = cpuSpan{pid: p.cmd.Process.Pid, brokerPID: b.brokerPID()}
	p.cpu.start()
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited returns an error once the server has exited on its own.
func (p *serverProc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("the server exited (%v); its log ends with:\n%s", p.err, p.logs.String())
	default:
		return nil
	}
}

// usage is the CPU time the server and the broker used since the start,
// and the server's peak memory: read while it still runs.
func (p *serverProc) usage() (proc, brok time.Duration, peakMiB float64) {
	proc, brok = p.cpu.since()
	return proc, brok, procPeakMiB(p.cmd.Process.Pid)
}

// stop ends the server with SIGTERM (it commits the batch in hand) and
// waits for it; it is killed after serverStopTimeout.
func (p *serverProc) stop() error {
	select {
	case <-p.done:
		return p.exitError()
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(serverStopTimeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.exitError()
	case <-t.C:
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("the server did not stop within %v; killed", serverStopTimeout)
	}
}

func (p *serverProc) exitError() error {
	if p.err != nil {
		return fmt.Errorf("the server: %w; its log ends with:\n%s", p.err, p.logs.String())
	}
	return nil
}

// serverEnv is env without OUTBOXD_ settings: the server reads them as
// configuration, and the bench's flags must be all it runs with (a feed
// set in the environment would be a second feed).
func serverEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "OUTBOXD_") {
			out = append(out, kv)
		}
	}
	return out
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

type multiWriter []interface{ Write([]byte) (int, error) }

func (m multiWriter) Write(p []byte) (int, error) {
	for _, w := range m {
		w.Write(p)
	}
	return len(p), nil
}

// watcher reads an engine's database while the server writes it: a store
// of the bench's own on the same file, which never writes after opening it
// (it creates the schema before the server starts, so the two never
// migrate at once).
type watcher struct{ store *outbox.Store }

// openWatcher opens (creating) the database at path.
func (b *bench) openWatcher(ctx context.Context, path string) (*watcher, error) {
	cfg := outbox.DefaultConfig(path)
	cfg.Synchronous = outbox.SyncMode(b.o.Synchronous)
	s, err := outbox.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &watcher{store: s}, nil
}

func (w *watcher) close() error { return w.store.Close() }

// position is the feed's stored position (partition 0), 0 before any.
func (w *watcher) position(ctx context.Context) (int64, error) {
	cps, err := w.store.ReadPositions(ctx, benchFeed)
	if err != nil || len(cps) == 0 {
		return 0, err
	}
	return cps[0].Position, nil
}

// applied is what the feed's stored positions cover: for a Kafka feed the
// sum over its partitions of offset+1 of the last applied record.
func (w *watcher) applied(ctx context.Context) (int64, error) {
	cps, err := w.store.ReadPositions(ctx, benchFeed)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, c := range cps {
		n += c.Position
	}
	return n, nil
}

// pollEvery is how often a phase looks at the engine's database: it bounds
// how much a measurement can overstate.
const pollEvery = 2 * time.Millisecond

// waitUntil polls cond every pollEvery until it holds, the server exits or
// ctx is done.
func waitUntil(ctx context.Context, p *serverProc, what string, cond func() (bool, error)) error {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if err := p.exited(); err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-p.done:
		case <-t.C:
		}
	}
}
