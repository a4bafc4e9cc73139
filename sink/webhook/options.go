package webhook

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Option names a sink's configuration may set (options: in the sinks:
// section), each documented in docs/sinks.md.
const (
	OptConcurrency     = "concurrency"      // requests in flight (default 8)
	OptTimeout         = "timeout"          // each request (default 10s)
	OptAttempts        = "attempts"         // of one output in one delivery (default 10)
	OptMinBackoff      = "min_backoff"      // default 100ms
	OptMaxBackoff      = "max_backoff"      // default 30s
	OptMaxRetryAfter   = "max_retry_after"  // the longest Retry-After obeyed (default 60s)
	OptBreakerFailures = "breaker_failures" // consecutive failures that open the breaker (default 5)
	OptBreakerOpen     = "breaker_open"     // how long it stays open before a probe (default 30s)
	OptMaxErrorBody    = "max_error_body"   // bytes of a refusal's body kept (default 4096)
)

var options = []string{OptConcurrency, OptTimeout, OptAttempts, OptMinBackoff, OptMaxBackoff, OptMaxRetryAfter,
	OptBreakerFailures, OptBreakerOpen, OptMaxErrorBody}

// ConfigFrom makes the configuration of sink name from its URL, its
// secret, the paths of its topics (topic -> path; empty: the URL itself)
// and its options; an unknown option or a bad value is an error naming it.
func ConfigFrom(name, rawURL, secret string, paths map[string]string, opts map[string]string) (Config, error) {
	c := Config{URL: rawURL, Sink: name, Secret: secret}
	for topic, p := range paths {
		if p == "" {
			continue
		}
		if c.Paths == nil {
			c.Paths = map[string]string{}
		}
		c.Paths[topic] = p
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := opts[k]
		var err error
		switch k {
		case OptConcurrency:
			c.Concurrency, err = count(v, 1, 1024)
		case OptAttempts:
			c.Attempts, err = count(v, 1, 1000000)
		case OptBreakerFailures:
			c.BreakerFailures, err = count(v, 1, 1000000)
		case OptMaxErrorBody:
			c.MaxErrorBody, err = count(v, 1, 1<<20)
		case OptTimeout:
			c.Timeout, err = duration(v)
		case OptMinBackoff:
			c.MinBackoff, err = duration(v)
		case OptMaxBackoff:
			c.MaxBackoff, err = duration(v)
		case OptMaxRetryAfter:
			c.MaxRetryAfter, err = duration(v)
		case OptBreakerOpen:
			c.BreakerOpen, err = duration(v)
		default:
			return Config{}, fmt.Errorf("option %q: a webhook sink reads %s", k, strings.Join(options, ", "))
		}
		if err != nil {
			return Config{}, fmt.Errorf("option %s: %q: %w", k, v, err)
		}
	}
	if err := c.Check(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func count(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("want a number from %d to %d", lo, hi)
	}
	return n, nil
}

func duration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("want a positive duration such as 500ms or 30s")
	}
	return d, nil
}
