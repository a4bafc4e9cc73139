package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/testcerts"
	"github.com/outboxd/outboxd/outbox"
)

// openServer starts a real server on a free loopback port.
func openServer(t *testing.T, cfg api.Config, feeds []api.Feed, relay api.Relay, log *slog.Logger) *api.Server {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	srv, err := api.New(cfg, openStore(t), feeds, relay, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return srv
}

func TestServer_OpenClose(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		srv, err := api.New(api.Config{Addr: "127.0.0.1:0"}, openStore(t), nil, nil, quiet())
		if err != nil {
			t.Fatal(err)
		}
		if srv.URL() != "" {
			t.Fatalf("URL before Open: %q", srv.URL())
		}
		if err := srv.Open(); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(srv.URL(), "http://127.0.0.1:") {
			t.Fatalf("URL %q", srv.URL())
		}
		code, _, b := request(t, srv.URL(), http.MethodGet, "/healthz", "", nil)
		if code != http.StatusOK || strings.TrimSpace(string(b)) != `{"status":"ok"}` {
			t.Fatalf("healthz: %d %s", code, b)
		}
		if err := srv.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := http.Get(srv.URL() + "/healthz"); err == nil {
			t.Fatal("the server still answers after Close")
		}
	})
	t.Run("AddressInUse", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		srv, err := api.New(api.Config{Addr: ln.Addr().String()}, openStore(t), nil, nil, quiet())
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Open(); err == nil {
			srv.Close(context.Background())
			t.Fatal("Open on a busy address succeeded")
		}
	})
	t.Run("CloseWaitsForRequests", func(t *testing.T) {
		release, inHandler := make(chan struct{}), make(chan struct{}, 1)
		f := &stubFeed{name: "slow", state: func() (outbox.FeedState, string) {
			inHandler <- struct{}{}
			<-release
			return "running", ""
		}}
		// No history sampling: it would call the feed's State too.
		srv := openServer(t, api.Config{HistoryEvery: -1}, []api.Feed{f}, nil, quiet())
		done := make(chan int, 1)
		go func() {
			res, err := http.Get(srv.URL() + "/feeds/slow/status")
			if err != nil {
				done <- 0
				return
			}
			res.Body.Close()
			done <- res.StatusCode
		}()
		<-inHandler // the request is in the handler
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := srv.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close with a request in flight past its deadline = %v, want DeadlineExceeded", err)
		}
		close(release)
		<-done
	})
}

// stubFeed is an api.Feed with scripted answers.
type stubFeed struct {
	name  string
	state func() (outbox.FeedState, string)
}

func (f *stubFeed) Name() string                      { return f.name }
func (f *stubFeed) Kind() string                      { return "file" }
func (f *stubFeed) Source() string                    { return "/dev/null" }
func (f *stubFeed) Processor() string                 { return "forward" }
func (f *stubFeed) State() (outbox.FeedState, string) { return f.state() }
func (f *stubFeed) Ends() map[int32]int64             { return map[int32]int64{0: 0} }
func (f *stubFeed) Requeue(context.Context, int64, outbox.Requeue) (bool, error) {
	return false, errors.New("stub")
}

// TestServer_SlowHeaders: a client that sends its headers one byte a
// second is cut off after ReadHeaderTimeout.
func TestServer_SlowHeaders(t *testing.T) {
	srv := openServer(t, api.Config{ReadHeaderTimeout: 500 * time.Millisecond}, nil, nil, quiet())
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	go func() {
		for _, b := range []byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(time.Second)
		}
	}()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("read: %v after %v (the server did not close the connection)", err, elapsed)
	}
	if bytes.Contains(got, []byte("200 OK")) {
		t.Fatalf("the slow request was served: %q", got)
	}
	if elapsed < 400*time.Millisecond || elapsed > 3*time.Second {
		t.Fatalf("connection closed after %v, want about the 500ms ReadHeaderTimeout", elapsed)
	}
}

func TestServer_BodyTooLarge(t *testing.T) {
	srv := openServer(t, api.Config{MaxBody: 1024, AdminToken: testToken}, nil, nil, quiet())
	post := func(body io.Reader, size int64) (int, []byte) {
		req, err := http.NewRequest(http.MethodPost, srv.URL()+"/feeds/ledger/losses/ack", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = size // -1: chunked, the size unknown up front
		req.Header.Set("Authorization", "Bearer "+testToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	code, b := post(bytes.NewReader(make([]byte, 1025)), 1025)
	wantError(t, "declared over the cap", code, b, http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge)
	code, b = post(io.MultiReader(bytes.NewReader(make([]byte, 4096))), -1)
	wantError(t, "chunked over the cap", code, b, http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge)
	code, b = post(bytes.NewReader(make([]byte, 1024)), 1024)
	wantError(t, "at the cap (the feed is unknown)", code, b, http.StatusNotFound, api.CodeNotFound)
}

func TestServer_RecoversPanics(t *testing.T) {
	var logs syncBuffer
	f := &stubFeed{name: "boom", state: func() (outbox.FeedState, string) { panic("secret internal detail") }}
	srv := openServer(t, api.Config{}, []api.Feed{f}, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	code, _, b := request(t, srv.URL(), http.MethodGet, "/feeds/boom/status", "", nil)
	wantError(t, "panicking handler", code, b, http.StatusInternalServerError, api.CodeInternal)
	if strings.Contains(string(b), "secret") || strings.Contains(string(b), ".go:") {
		t.Fatalf("panic details reached the client: %s", b)
	}
	if !strings.Contains(logs.String(), "secret internal detail") || !strings.Contains(logs.String(), "stack=") {
		t.Fatalf("the panic was not logged with its stack: %s", logs.String())
	}
	if code, _, _ := request(t, srv.URL(), http.MethodGet, "/healthz", "", nil); code != http.StatusOK {
		t.Fatalf("after a panic: healthz %d", code)
	}
}

func TestServer_Readyz(t *testing.T) {
	readyz := func(t *testing.T, base string) (int, api.Readiness) {
		t.Helper()
		code, _, b := request(t, base, http.MethodGet, "/readyz", "", nil)
		var rd api.Readiness
		if err := json.Unmarshal(b, &rd); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return code, rd
	}
	t.Run("RelayOff", func(t *testing.T) {
		srv := openServer(t, api.Config{}, nil, nil, quiet())
		if code, rd := readyz(t, srv.URL()); code != http.StatusOK || !rd.Ready || len(rd.Reasons) != 0 {
			t.Fatalf("%d %+v", code, rd)
		}
	})
	t.Run("RelayConnected", func(t *testing.T) {
		r := &fakeRelay{}
		r.set(api.RelayStatus{Mode: "exactly-once", State: "idle", Connected: true})
		srv := openServer(t, api.Config{}, nil, r, quiet())
		if code, rd := readyz(t, srv.URL()); code != http.StatusOK || !rd.Ready {
			t.Fatalf("%d %+v", code, rd)
		}
	})
	t.Run("RelayDisconnected", func(t *testing.T) {
		r := &fakeRelay{}
		r.set(api.RelayStatus{Mode: "exactly-once", State: "backing-off", LastError: "no brokers"})
		srv := openServer(t, api.Config{}, nil, r, quiet())
		code, rd := readyz(t, srv.URL())
		if code != http.StatusServiceUnavailable || rd.Ready || len(rd.Reasons) != 1 ||
			rd.Reasons[0] != "relay: not connected (backing-off): no brokers" {
			t.Fatalf("%d %+v", code, rd)
		}
	})
	t.Run("DatabaseClosed", func(t *testing.T) {
		s := openStore(t)
		srv, err := api.New(api.Config{}, s, nil, nil, quiet())
		if err != nil {
			t.Fatal(err)
		}
		base := newTestServer(t, srv)
		s.Close()
		code, rd := readyz(t, base)
		if code != http.StatusServiceUnavailable || len(rd.Reasons) != 1 || !strings.HasPrefix(rd.Reasons[0], "database: not writable") {
			t.Fatalf("%d %+v", code, rd)
		}
	})
}

func TestServer_Dashboard(t *testing.T) {
	srv := openServer(t, api.Config{}, nil, nil, quiet())
	code, hdr, b := request(t, srv.URL(), http.MethodGet, "/", "", nil)
	if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") ||
		!strings.Contains(hdr.Get("Content-Security-Policy"), "script-src 'self'") ||
		!bytes.Contains(b, []byte(`src="/dashboard/dashboard.js"`)) {
		t.Fatalf("/: %d %v\n%s", code, hdr, b)
	}
	for path, ctype := range map[string]string{"/dashboard/dashboard.js": "javascript", "/dashboard/dashboard.css": "text/css"} {
		code, hdr, _ := request(t, srv.URL(), http.MethodGet, path, "", nil)
		if code != http.StatusOK || !strings.Contains(hdr.Get("Content-Type"), ctype) {
			t.Fatalf("%s: %d %q", path, code, hdr.Get("Content-Type"))
		}
	}
	for _, path := range []string{"/dashboard/", "/dashboard/nope.js"} {
		if code, _, _ := request(t, srv.URL(), http.MethodGet, path, "", nil); code != http.StatusNotFound {
			t.Fatalf("%s: %d, want 404", path, code)
		}
	}
}

// Beyond loopback, the API warns once for a missing admin token and once
// for a missing TLS; on loopback it warns for neither.
func TestServer_WarnsBeyondLoopback(t *testing.T) {
	tlsCfg := serverTLS(t).config
	for _, tc := range []struct {
		addr, token string
		tls         bool
		warns       []string
	}{
		{"127.0.0.1:0", "", false, nil},
		{"0.0.0.0:0", "", false, []string{"without an admin token", "without TLS"}},
		{"0.0.0.0:0", testToken, false, []string{"without TLS"}},
		{"0.0.0.0:0", "", true, []string{"without an admin token"}},
		{"0.0.0.0:0", testToken, true, nil},
	} {
		var logs syncBuffer
		cfg := api.Config{Addr: tc.addr, AdminToken: tc.token}
		if tc.tls {
			cfg.TLS = tlsCfg
		}
		srv, err := api.New(cfg, openStore(t), nil, nil, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Open(); err != nil {
			t.Fatal(err)
		}
		srv.Close(context.Background())
		out := logs.String()
		if got := strings.Count(out, "level=WARN"); got != len(tc.warns) {
			t.Errorf("addr %s, token %q, tls %v: %d warnings, want %d\n%s", tc.addr, tc.token, tc.tls, got, len(tc.warns), out)
		}
		for _, w := range tc.warns {
			if !strings.Contains(out, w) {
				t.Errorf("addr %s, token %q, tls %v: no warning %q\n%s", tc.addr, tc.token, tc.tls, w, out)
			}
		}
	}
}

type testTLS struct {
	config *tls.Config
	pool   *x509.CertPool
}

// serverTLS makes a CA and a server certificate for 127.0.0.1.
func serverTLS(t *testing.T) testTLS {
	t.Helper()
	ca, err := testcerts.NewCA(t.TempDir(), "api")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	return testTLS{config: testcerts.ServerTLS(pair, nil), pool: ca.Pool()}
}

// With TLS the API serves HTTPS only: a client trusting the CA gets its
// answers, a plain HTTP request gets none.
func TestServer_TLS(t *testing.T) {
	tt := serverTLS(t)
	srv, err := api.New(api.Config{Addr: "127.0.0.1:0", TLS: tt.config}, openStore(t), nil, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	if !strings.HasPrefix(srv.URL(), "https://127.0.0.1:") {
		t.Fatalf("URL %q, want https", srv.URL())
	}
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tt.pool}}}
	resp, err := cl.Get(srv.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Fatalf("GET /healthz over TLS: %d (tls %v)", resp.StatusCode, resp.TLS != nil)
	}
	plain := "http://" + strings.TrimPrefix(srv.URL(), "https://")
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(plain + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP got an answer from the TLS listener")
		}
	}
	if _, err := (&http.Client{Timeout: 5 * time.Second}).Get(srv.URL() + "/healthz"); err == nil {
		t.Fatal("a client not trusting the CA got an answer")
	}
}

func TestConfig_Validate(t *testing.T) {
	if err := api.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, mod := range map[string]func(c *api.Config){
		"NoPort":       func(c *api.Config) { c.Addr = "127.0.0.1" },
		"ZeroTimeout":  func(c *api.Config) { c.ReadHeaderTimeout = 0 },
		"NegativeBody": func(c *api.Config) { c.MaxBody = -1 },
		"ShortToken":   func(c *api.Config) { c.AdminToken = "short" },
		"SpaceInToken": func(c *api.Config) { c.AdminToken = "0123456789 0123456789" },
	} {
		c := api.DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
		if _, err := api.New(c, nil, nil, nil, nil); err == nil {
			t.Errorf("%s: New accepted %+v", name, c)
		}
	}
}

func TestLoadAdminToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  "+testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == api.EnvAdminToken {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name, path, env, want string
		fails                 bool
	}{
		{"None", "", "", "", false},
		{"File", file, "", testToken, false},
		{"Env", "", testToken, testToken, false},
		{"Both", file, testToken, "", true},
		{"Missing", filepath.Join(dir, "nope"), "", "", true},
		{"Empty", empty, "", "", true},
		{"ShortEnv", "", "short", "", true},
	} {
		got, err := api.LoadAdminToken(tc.path, env(tc.env))
		if (err != nil) != tc.fails || got != tc.want {
			t.Errorf("%s: %q, %v; want %q, error %v", tc.name, got, err, tc.want, tc.fails)
		}
	}
}

// syncBuffer collects logs written while the test reads them.
type syncBuffer = testutil.SyncBuffer
