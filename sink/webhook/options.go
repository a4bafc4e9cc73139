package webhook

import "github.com/outboxd/outboxd/sink"

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

// target names a webhook sink in errors.
const target = "a webhook sink"

// ConfigFrom makes the configuration of sink name from its URL, its
// secret, the paths of its topics (topic -> path; empty: the URL itself)
// and its options; an unknown option or a bad value is an error naming it.
func ConfigFrom(name, rawURL, secret string, paths map[string]string, opts map[string]string) (Config, error) {
	c := Config{URL: rawURL, Sink: name, Secret: secret}
	c.Paths = sink.Named(paths)
	if err := sink.SetOptions(target, opts, []sink.Option{
		{Name: OptConcurrency, Set: sink.Count(&c.Concurrency, 1, 1024)},
		{Name: OptTimeout, Set: sink.Duration(&c.Timeout)},
		{Name: OptAttempts, Set: sink.Count(&c.Attempts, 1, 1000000)},
		{Name: OptMinBackoff, Set: sink.Duration(&c.MinBackoff)},
		{Name: OptMaxBackoff, Set: sink.Duration(&c.MaxBackoff)},
		{Name: OptMaxRetryAfter, Set: sink.Duration(&c.MaxRetryAfter)},
		{Name: OptBreakerFailures, Set: sink.Count(&c.BreakerFailures, 1, 1000000)},
		{Name: OptBreakerOpen, Set: sink.Duration(&c.BreakerOpen)},
		{Name: OptMaxErrorBody, Set: sink.Count(&c.MaxErrorBody, 1, 1<<20)},
	}); err != nil {
		return Config{}, err
	}
	if err := c.Check(); err != nil {
		return Config{}, err
	}
	return c, nil
}
