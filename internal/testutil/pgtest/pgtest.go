// Package pgtest finds a PostgreSQL server for outboxd's tests and gives
// each test a database of its own, dropped when the test ends.
//
// The server is, in order: the DSN in the environment variable
// OUTBOXD_TEST_POSTGRES (a test fails when it is set and does not answer),
// else 127.0.0.1:5432 as user postgres without a password, else the same
// user over the Unix socket in /var/run/postgresql or /tmp. When none
// answers, the test is skipped with one line saying so.
//
// Proxy puts a TCP forwarder between a test and the server, so a test can
// take the database away and bring it back without stopping a server that
// other tests share.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN is the environment variable that names the server to test
// against, as a DSN (a postgres:// URL or libpq key=value pairs).
const EnvDSN = "OUTBOXD_TEST_POSTGRES"

// connectTimeout bounds each attempt to reach a candidate server.
const connectTimeout = 5 * time.Second

var (
	findOnce sync.Once
	foundDSN string
	findErr  error // set when the environment's DSN does not answer
	findMiss string
)

// candidates are the servers tried when EnvDSN is not set, in order.
var candidates = []string{
	"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
	"host=/var/run/postgresql port=5432 user=postgres dbname=postgres sslmode=disable",
	"host=/tmp port=5432 user=postgres dbname=postgres sslmode=disable",
}

func find() {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		if err := ping(dsn); err != nil {
			findErr = fmt.Errorf("pgtest: %s is set but its server does not answer: %w", EnvDSN, err)
			return
		}
		foundDSN = dsn
		return
	}
	var errs []string
	for _, dsn := range candidates {
		err := ping(dsn)
		if err == nil {
			foundDSN = dsn
			return
		}
		errs = append(errs, err.Error())
	}
	findMiss = "no PostgreSQL for this test: " + EnvDSN + " is not set and neither 127.0.0.1:5432 nor a Unix socket answers as user postgres (" + strings.Join(errs, "; ") + ")"
}

func ping(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.Ping(ctx)
}

// ServerDSN returns the DSN of the server found (connecting to its
// maintenance database), skipping the test when there is none and failing
// it when EnvDSN names one that does not answer.
func ServerDSN(tb testing.TB) string {
	tb.Helper()
	findOnce.Do(find)
	if findErr != nil {
		tb.Fatal(findErr)
	}
	if foundDSN == "" {
		tb.Skip(findMiss)
	}
	return foundDSN
}

// DB is a database made for one test.
type DB struct {
	// Name is the database's name, unique to the test.
	Name string
	// DSN connects to it as the server's user.
	DSN string
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// New creates a database with a unique name on the server ServerDSN finds
// and drops it when the test ends (after the test's other cleanups, and
// forcing out connections the test left open).
func New(tb testing.TB) *DB {
	tb.Helper()
	server := ServerDSN(tb)
	name := dbName(tb.Name())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, server)
	if err != nil {
		tb.Fatalf("pgtest: connect to create a database: %v", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := drop(server, name); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	dsn, err := WithDatabase(server, name)
	if err != nil {
		tb.Fatal(err)
	}
	return &DB{Name: name, DSN: dsn}
}

// dbName makes a database name from a test's name: a prefix, the test's
// name in lower case with anything but letters, digits and _ folded to _,
// and a random suffix, within PostgreSQL's 63 bytes.
func dbName(test string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	base := unsafeName.ReplaceAllString(strings.ToLower(test), "_")
	const room = 63 - len("outboxd_test__") - 12
	if len(base) > room {
		base = base[:room]
	}
	return "outboxd_test_" + base + "_" + hex.EncodeToString(b[:])
}

func drop(server, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, server)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// Conn opens a connection to the database, closed when the test ends.
func (d *DB) Conn(tb testing.TB) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		tb.Fatalf("pgtest: connect to %s: %v", d.Name, err)
	}
	tb.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// WithDatabase returns dsn (a URL or key=value pairs) connecting to the
// database name instead of its own.
func WithDatabase(dsn, name string) (string, error) {
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pgtest: parse DSN: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	// In key=value pairs the last setting of a key wins.
	return dsn + " dbname=" + quoteValue(name), nil
}

// WithAddr returns dsn connecting to the TCP address addr (host:port)
// instead of its own server.
func WithAddr(dsn, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("pgtest: address %q: %w", addr, err)
	}
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pgtest: parse DSN: %w", err)
		}
		u.Host = net.JoinHostPort(host, port)
		return u.String(), nil
	}
	return dsn + " host=" + quoteValue(host) + " port=" + port, nil
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

func quoteValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// serverAddr returns where the server listens, for the proxy to dial:
// network "tcp" or "unix" and the address.
func serverAddr(dsn string) (network, addr string, err error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", "", fmt.Errorf("pgtest: parse DSN: %w", err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "unix", cfg.Host + "/.s.PGSQL." + strconv.Itoa(int(cfg.Port)), nil
	}
	return "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// Proxy forwards TCP connections from a listener on 127.0.0.1 to the
// server. Down cuts every connection and refuses new ones (as a server
// that went away), Up accepts again.
type Proxy struct {
	ln      net.Listener
	network string
	target  string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to d's server and returns it with d's DSN
// rewritten to go through it; both are closed when the test ends.
func (d *DB) NewProxy(tb testing.TB) (*Proxy, string) {
	tb.Helper()
	network, target, err := serverAddr(d.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pgtest: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, network: network, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	dsn, err := WithAddr(d.DSN, ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	return p, dsn
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Down closes every forwarded connection and refuses new ones until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// Up accepts connections again.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.forward(c)
		}()
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) forward(c net.Conn) {
	defer c.Close()
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	s, err := net.DialTimeout(p.network, p.target, connectTimeout)
	if err != nil {
		return
	}
	defer s.Close()
	if !p.track(s) {
		return
	}
	defer p.untrack(s)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(s, c)
	go pipe(c, s)
	<-done
	// One direction ended: end the other by closing both.
	c.Close()
	s.Close()
	<-done
}

func (p *Proxy) close() {
	p.ln.Close()
	p.Down()
	p.wg.Wait()
}
