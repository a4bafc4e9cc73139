package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkQueries_UnderIngest measures the state queries against the
// server binary while it ingests a ledger file at full speed (relay off):
// the ingest rate with no client, with one and then with 50 clients each
// asking for a balance in a loop on a kept-alive connection, those
// queries' latency, and the CPU per answer of the server (above what
// ingest alone took) and of the clients. It reports, it does not assert:
// run it alone, under the shared lock,
//
//	go test -run '^$' -bench BenchmarkQueries_UnderIngest -benchtime 1x ./tests/
//
// With OUTBOXD_QUERYBENCH_CPUPROFILE=PREFIX each phase's server writes a
// CPU profile to PREFIX.quiet, PREFIX.single and PREFIX.loaded.
func BenchmarkQueries_UnderIngest(b *testing.B) {
	const (
		lines    = 1_000_000
		accounts = 1000
		clients  = 50
	)
	dir := b.TempDir()
	input, cfg := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "outboxd.yaml")
	var sb strings.Builder
	for i := range lines {
		fmt.Fprintf(&sb, "acct-%04d,1\n", i%accounts)
	}
	if err := os.WriteFile(input, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(queriesYAML+benchQueryYAML), 0o644); err != nil {
		b.Fatal(err)
	}
	end := int64(sb.Len())
	for range b.N {
		quiet := ingestRate(b, dir, "quiet", cfg, input, end, 0, nil)
		b.Logf("alone: ingest %.0f lines/s, server CPU %.2f s over %.2f s", quiet.rate, quiet.serverCPU, quiet.wall)
		var one, lat latencies
		single := ingestRate(b, dir, "single", cfg, input, end, 1, &one)
		p50one, p99one, maxOne := one.percentiles()
		srv1, cl1 := single.perAnswer(quiet, one.count())
		b.Logf("one client querying in a loop: ingest %.0f lines/s (%.2f of alone); %d queries, %.0f/s, p50 %.2f ms, p99 %.2f ms, max %.2f ms; CPU per answer: server %.1f µs, client %.1f µs",
			single.rate, single.rate/quiet.rate, one.count(), float64(one.count())/one.seconds(), ms(p50one), ms(p99one), ms(maxOne), srv1, cl1)
		b.ReportMetric(ms(p99one), "query-p99-ms-1-client")
		loaded := ingestRate(b, dir, "loaded", cfg, input, end, clients, &lat)
		p50, p99, max := lat.percentiles()
		srv, cl := loaded.perAnswer(quiet, lat.count())
		b.ReportMetric(quiet.rate, "lines/s-quiet")
		b.ReportMetric(loaded.rate, "lines/s-50-clients")
		b.ReportMetric(loaded.rate/quiet.rate, "ingest-ratio")
		b.ReportMetric(float64(lat.count())/lat.seconds(), "queries/s")
		b.ReportMetric(ms(p50), "query-p50-ms")
		b.ReportMetric(ms(p99), "query-p99-ms")
		b.ReportMetric(ms(max), "query-max-ms")
		b.ReportMetric(srv, "server-µs/answer")
		b.ReportMetric(cl, "client-µs/answer")
		b.Logf("ingest %.0f lines/s alone, %.0f with %d clients querying (%.2f); %d queries, %.0f/s, p50 %.2f ms, p99 %.2f ms, max %.2f ms; CPU per answer: server %.1f µs, client %.1f µs (server %.2f s, client %.2f s over %.2f s)",
			quiet.rate, loaded.rate, clients, loaded.rate/quiet.rate, lat.count(), float64(lat.count())/lat.seconds(), ms(p50), ms(p99), ms(max),
			srv, cl, loaded.serverCPU, loaded.client, loaded.wall)
	}
}

// benchQueryYAML adds the query the bench follows the feed's position
// with.
const benchQueryYAML = `  position: "SELECT position FROM positions WHERE feed = 'ledger'"
`

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// envQueryProfile names a file prefix: with it set, each phase's server
// writes a CPU profile to PREFIX.PHASE (go tool pprof reads it) and is
// stopped with SIGTERM, so the profile is complete.
const envQueryProfile = "OUTBOXD_QUERYBENCH_CPUPROFILE"

// phase is what one run of the server measured, from its first stored
// position to the file's end.
type phase struct {
	rate              float64 // lines per second
	wall              float64 // seconds
	serverCPU, client float64 // CPU seconds of the server and of the bench's own process
}

// perAnswer is the CPU per answer, in microseconds, of the server above
// what ingest alone took over the same lines (quiet), and of the bench's
// clients.
func (p phase) perAnswer(quiet phase, answers int) (server, client float64) {
	if answers == 0 {
		return 0, 0
	}
	return (p.serverCPU - quiet.serverCPU) / float64(answers) * 1e6, (p.client - quiet.client) / float64(answers) * 1e6
}

// ingestRate runs the server on a fresh database over input with clients
// querying a balance in a loop, and measures it from its first stored
// position to the file's end.
func ingestRate(b *testing.B, dir, name, cfg, input string, end int64, clients int, lat *latencies) phase {
	b.Helper()
	api := "127.0.0.1:" + freePort(b)
	db := filepath.Join(dir, name+".db")
	args := []string{"--config", cfg, "--db", db, "--http", api, "--relay", "none",
		"--feed", "ledger=file:" + input, "--processor", "ledger=ledger"}
	var env []string
	if prefix := os.Getenv(envQueryProfile); prefix != "" {
		// The bench's child mode runs the server as it is, profiled.
		env = []string{"OUTBOXD_BENCH_SERVER_CHILD=1", "OUTBOXD_BENCH_SERVER_CPUPROFILE=" + prefix + "." + name}
		args = append([]string{"bench"}, args...)
	}
	p := startBin(b, serverBin, env, args...)
	defer p.kill()
	base := "http://" + api
	var stop atomic.Bool
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range clients {
		wg.Go(func() { queryLoop(base, fmt.Sprintf("acct-%04d", i), &stop, lat) })
	}
	var t0 time.Time
	var pos0 int64
	var cpu0, self0 float64
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		pos := statusPosition(base)
		if pos > 0 && t0.IsZero() {
			t0, pos0 = time.Now(), pos
			cpu0, self0 = processCPU(b, p.cmd.Process.Pid), selfCPU()
		}
		if pos == end {
			wall := time.Since(t0).Seconds()
			ph := phase{rate: float64(end-pos0) / float64(len("acct-0000,1\n")) / wall, wall: wall,
				serverCPU: processCPU(b, p.cmd.Process.Pid) - cpu0, client: selfCPU() - self0}
			if len(env) > 0 {
				stop.Store(true)
				wg.Wait()
				p.cmd.Process.Signal(syscall.SIGTERM)
				<-p.done
			}
			return ph
		}
		time.Sleep(positionPoll)
	}
	b.Fatalf("%s: the feed did not reach %d within 5 minutes", name, end)
	return phase{}
}

// positionPoll is how often the bench asks the feed's position: 5 ms is
// 0.1% of a phase of several seconds.
const positionPoll = 5 * time.Millisecond

// processCPU is the CPU seconds (user and system) process pid has used,
// from /proc.
func processCPU(b *testing.B, pid int) float64 {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("server CPU: %v", err)
	}
	// The fields after the command's name (which may hold spaces) in its
	// parentheses: utime and stime are the 12th and 13th, in clock ticks.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clockTicks
}

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times.
const clockTicks = 100

// selfCPU is the CPU seconds the bench's own process has used.
func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// queryLoop asks for account's balance until stop, on one kept-alive
// connection, recording each answer's latency in lat.
func queryLoop(base, account string, stop *atomic.Bool, lat *latencies) {
	path := "/queries/balance?account=" + account
	var c *httpConn
	for !stop.Load() {
		if c == nil {
			var err error
			if c, err = dialHTTP(strings.TrimPrefix(base, "http://")); err != nil {
				time.Sleep(10 * time.Millisecond) // the server is not up yet
				continue
			}
		}
		t := time.Now()
		status, body, err := c.get(path)
		if err != nil {
			c.close()
			c = nil
			continue
		}
		if status == http.StatusOK && bytes.HasPrefix(body, balanceHead) {
			lat.add(time.Since(t))
		}
	}
	if c != nil {
		c.close()
	}
}

// balanceHead starts every answer of the balance query.
var balanceHead = []byte(`{"query":"balance","columns":["account","balance","lines"],"rows":[`)

// httpConn is one kept-alive HTTP/1.1 connection asking GETs and reading
// each answer whole. It is the bench's client in place of net/http's,
// which took as much CPU per answer as the server: the bench's clients
// share the machine with the server and its ingest, so what they spend is
// taken from what is measured.
type httpConn struct {
	conn net.Conn
	r    *bufio.Reader
	req  []byte
	body []byte
	host string
}

func dialHTTP(host string) (*httpConn, error) {
	conn, err := net.Dial("tcp", host)
	if err != nil {
		return nil, err
	}
	return &httpConn{conn: conn, r: bufio.NewReaderSize(conn, 4096), host: host}, nil
}

func (c *httpConn) close() { c.conn.Close() }

// get asks for path and returns the answer's status and body (valid until
// the next get). An answer without a Content-Length, or one that closes
// the connection, is an error: the caller dials again.
func (c *httpConn) get(path string) (int, []byte, error) {
	c.conn.SetDeadline(time.Now().Add(10 * time.Second))
	c.req = append(append(append(append(c.req[:0], "GET "...), path...), " HTTP/1.1\r\nHost: "...), c.host...)
	c.req = append(c.req, "\r\n\r\n"...)
	if _, err := c.conn.Write(c.req); err != nil {
		return 0, nil, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, nil, fmt.Errorf("status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("status line %q", line)
	}
	size, keep := -1, true
	for {
		h, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, nil, err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		name, value, _ := bytes.Cut(h, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if size, err = strconv.Atoi(string(value)); err != nil {
				return 0, nil, fmt.Errorf("content length %q", value)
			}
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			keep = false
		}
	}
	if size < 0 {
		return 0, nil, errors.New("an answer without a Content-Length")
	}
	c.body = slices.Grow(c.body[:0], size)[:size]
	if _, err := io.ReadFull(c.r, c.body); err != nil {
		return 0, nil, err
	}
	if !keep {
		return status, c.body, errors.New("the server closed the connection")
	}
	return status, c.body, nil
}

// statusPosition is the ledger feed's position, -1 while unknown. It
// asks the position query, not the feed's status: under ingest with the
// relay off a status answer cost the server some 2 ms of CPU, forty
// times a query's, and polled every 5 ms it took a tenth of the server's
// CPU from every phase.
func statusPosition(base string) int64 {
	res, err := http.Get(base + "/queries/position")
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	var ans struct{ Rows []struct{ Position int64 } }
	if json.NewDecoder(res.Body).Decode(&ans) != nil || len(ans.Rows) != 1 {
		return -1
	}
	return ans.Rows[0].Position
}

// latencies collects query latencies from many goroutines.
type latencies struct {
	mu          sync.Mutex
	d           []time.Duration
	first, last time.Time
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.first.IsZero() {
		l.first = now
	}
	l.last = now
	l.d = append(l.d, d)
}

func (l *latencies) count() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.d) }

func (l *latencies) seconds() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.last.Sub(l.first).Seconds(), 1e-9)
}

func (l *latencies) percentiles() (p50, p99, max time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100], s[len(s)-1]
}
