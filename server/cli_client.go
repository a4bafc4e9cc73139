package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/outboxd/outboxd/api"
)

// EnvToken is the environment variable the API commands (status,
// dead-letters, losses, topics) read their bearer token from when
// --token and --token-file are not given; OUTBOXD_ADMIN_TOKEN, the
// server's own, is read after it.
const EnvToken = "OUTBOXD_TOKEN"

// cliName is the program's name, for the API commands' messages.
func cliName() string { return programName }

// apiFlags are the flags every API command takes.
type apiFlags struct {
	url, token, tokenFile string
	json                  bool
	timeout               time.Duration
}

// defaultAPIURL is the server's default listen address (or the one
// OUTBOXD_HTTP gives it), as a URL.
func defaultAPIURL(getenv func(string) string) string {
	addr := api.DefaultConfig().Addr
	if v := getenv(envName("http")); v != "" {
		addr = v
	}
	return "http://" + addr
}

func (a *apiFlags) register(fs *flag.FlagSet, withJSON bool) {
	fs.StringVar(&a.url, "url", defaultAPIURL(os.Getenv), "the server's HTTP API, `URL` (default: its default listen address, or OUTBOXD_HTTP's)")
	fs.StringVar(&a.token, "token", "", "bearer `TOKEN` of the server (default: "+EnvToken+", then "+api.EnvAdminToken+")")
	fs.StringVar(&a.tokenFile, "token-file", "", "`FILE` holding the bearer token")
	fs.DurationVar(&a.timeout, "timeout", 30*time.Second, "give up after `D`")
	if withJSON {
		fs.BoolVar(&a.json, "json", false, "print the API's JSON answer as is")
	}
}

// parseAPICommand parses args into fs, flags and positional arguments in
// any order, and checks the count of positional arguments (want names
// them). It returns done with the exit code for -h and for bad usage.
func parseAPICommand(fs *flag.FlagSet, args []string, synopsis string, want []string, optional int, stdout, stderr io.Writer) (pos []string, code int, done bool) {
	fs.SetOutput(io.Discard)
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			name, _, _ := strings.Cut(fs.Name(), " ")
			helpOf(stdout, name, synopsis, fs)
			return nil, ExitOK, true
		}
		if err != nil {
			return nil, apiUsage(stderr, fs.Name(), flagError(fs, err)), true
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) < len(want)-optional || len(pos) > len(want) {
		return nil, apiUsage(stderr, fs.Name(), fmt.Errorf("want %s (see %s %s -h)", strings.Join(want, " "), cliName(), fs.Name())), true
	}
	return pos, 0, false
}

// apiUsage prints a usage error on one line and returns ExitConfig.
func apiUsage(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s %s: %s\n", cliName(), cmd, oneLine(err.Error()))
	return ExitConfig
}

// apiFailed prints a failure on one line and returns ExitFailed.
func apiFailed(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s %s: %s\n", cliName(), cmd, oneLine(err.Error()))
	return ExitFailed
}

// apiClient talks to a running server's API.
type apiClient struct {
	base  string
	token string
	hc    *http.Client
}

// client resolves the flags: the URL checked, the token read.
func (a *apiFlags) client(getenv func(string) string) (*apiClient, error) {
	u, err := url.Parse(a.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url %q: want http://HOST:PORT or https://HOST:PORT", a.url)
	}
	tok := a.token
	switch {
	case tok != "" && a.tokenFile != "":
		return nil, errors.New("--token and --token-file: give one")
	case a.tokenFile != "":
		b, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		tok = string(b)
	case tok == "":
		if tok = getenv(EnvToken); tok == "" {
			tok = getenv(api.EnvAdminToken)
		}
	}
	return &apiClient{base: strings.TrimRight(a.url, "/"), token: strings.TrimSpace(tok), hc: &http.Client{Timeout: a.timeout}}, nil
}

// apiError is an error answer of the API.
type apiError struct {
	status        int
	code, message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s (HTTP %d, %s)", e.message, e.status, e.code)
}

// do sends a request and returns the answer's body, or an *apiError for
// an error answer, or an error saying the server could not be reached.
func (c *apiClient) do(ctx context.Context, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the server at %s (is it running? --url): %w", c.base, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if res.StatusCode >= 300 {
		var eb api.ErrorBody
		if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
			return nil, &apiError{status: res.StatusCode, code: eb.Error.Code, message: eb.Error.Message}
		}
		return nil, fmt.Errorf("%s %s: HTTP %s: %.200s", method, path, res.Status, b)
	}
	return b, nil
}

// getJSON GETs path into v, returning the raw body too.
func (c *apiClient) getJSON(ctx context.Context, path string, v any) ([]byte, error) {
	b, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("GET %s: the answer is not the API's JSON: %w", path, err)
	}
	return b, nil
}

// postJSON POSTs body to path and decodes the answer into v.
func (c *apiClient) postJSON(ctx context.Context, path string, body, v any) ([]byte, error) {
	b, err := c.do(ctx, http.MethodPost, path, body)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("POST %s: the answer is not the API's JSON: %w", path, err)
	}
	return b, nil
}

// feedPath is /feeds/NAME with the name escaped.
func feedPath(name string) string { return "/feeds/" + url.PathEscape(name) }
