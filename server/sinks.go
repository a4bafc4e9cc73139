package server

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outboxd/sink"
)

// SinkConfig is one sink: a target other than Kafka the outbox is relayed
// to (docs/sinks.md). The URL's scheme picks the target: nats:// for
// NATS JetStream, and the schemes the other target packages register.
type SinkConfig struct {
	Name string `yaml:"name" usage:"the sink's name: its progress, status and metrics go by it (--sink NAME=URL)"`
	URL  string `yaml:"url" usage:"where the target is; its scheme picks the target: nats://, postgres://, https:// or http://"`
	// Topics maps each output topic the sink takes to where it goes; none:
	// every topic, with the target's defaults.
	Topics map[string]*SinkTopicConfig `yaml:"topics"`
	// Secret (or SecretFile, which holds it) signs what a webhook sink sends.
	Secret     string `yaml:"secret" usage:"the sink's secret, for targets that sign (webhooks); or secretFile"`
	SecretFile string `yaml:"secretFile" usage:"a FILE holding the sink's secret"`
	// Options are the target's own settings (docs/sinks.md lists each
	// target's).
	Options map[string]string `yaml:"options" usage:"NAME: VALUE, the target's own settings (docs/sinks.md)"`
	// Batch is the most rows per delivery (0: 1000).
	Batch int `yaml:"batch" usage:"most outbox rows per delivery to the target (0: 1000)"`
}

// SinkTopicConfig is where one output topic goes in a sink's target; each
// target reads its own fields (an empty one takes the target's default).
type SinkTopicConfig struct {
	Stream  string `yaml:"stream" usage:"NATS JetStream: the stream (default: the sink's options.stream)"`
	Subject string `yaml:"subject" usage:"NATS JetStream: the subject (default: the topic's name)"`
	Table   string `yaml:"table" usage:"PostgreSQL: the table"`
	Path    string `yaml:"path" usage:"webhooks: the path, joined to the sink's URL"`
}

// sinkFlag is --sink NAME=URL (repeatable): the sink NAME of the file
// gets URL, or a new sink NAME taking every topic is added.
type sinkFlag struct{ c *Config }

func (f sinkFlag) String() string { return "" }

func (f sinkFlag) settingKey() string { return "sinks[].url" }

// repeatable says the environment's value is a comma-separated list.
func (f sinkFlag) repeatable() {}

func (f sinkFlag) Set(s string) error {
	name, u, ok := strings.Cut(s, "=")
	if !ok || name == "" || u == "" {
		return fmt.Errorf("%q: want NAME=URL, such as events=nats://127.0.0.1:4222", s)
	}
	if !sink.ValidName(name) {
		return fmt.Errorf("%q: a sink's name is letters, digits, '.', '_' and '-'", s)
	}
	if _, err := sink.ParseURL(u); err != nil {
		return err
	}
	for i := range f.c.Sinks {
		if f.c.Sinks[i].Name == name {
			f.c.Sinks[i].URL = u
			return nil
		}
	}
	f.c.Sinks = append(f.c.Sinks, SinkConfig{Name: name, URL: u})
	return nil
}

// sinkError is err about the sink at index i, naming it: "--sink NAME=URL" for
// one the command line or environment gave, its entry for the file's.
func (c *Config) sinkError(i int, field string, err error) error {
	s := c.Sinks[i]
	if path, line, ok := fileOrigin(c.Origin(fmt.Sprintf("sinks[%d].%s", i, field))); ok {
		return &FileError{Path: path, Line: line, Key: fmt.Sprintf("sinks[%d].%s", i, field), Msg: err.Error()}
	}
	if path, line, ok := fileOrigin(c.Origin(fmt.Sprintf("sinks[%d].name", i))); ok {
		return &FileError{Path: path, Line: line, Key: fmt.Sprintf("sinks[%d]", i), Msg: err.Error()}
	}
	return fmt.Errorf("--sink %s=%s: %w", s.Name, redactURL(s.URL), err)
}

// redactURL is raw without its password.
func redactURL(raw string) string {
	u, err := sink.ParseURL(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

// validateSinks reports every invalid sink (ConfigErrors when more than
// one): a name missing, bad or given twice, a URL no target takes, a
// setting its target refuses.
func (c *Config) validateSinks() error {
	var errs []error
	seen := map[string]bool{}
	for i := range c.Sinks {
		s := &c.Sinks[i]
		switch {
		case !sink.ValidName(s.Name):
			errs = append(errs, c.sinkError(i, "name", fmt.Errorf("sink %q: a name is letters, digits, '.', '_' and '-'", s.Name)))
			continue
		case seen[s.Name]:
			errs = append(errs, c.sinkError(i, "name", fmt.Errorf("sink %s: given twice", s.Name)))
			continue
		}
		seen[s.Name] = true
		if s.Batch < 0 {
			errs = append(errs, c.sinkError(i, "batch", fmt.Errorf("sink %s: batch %d, want 0 (1000) or more", s.Name, s.Batch)))
		}
		if s.Secret != "" && s.SecretFile != "" {
			errs = append(errs, c.sinkError(i, "secretFile", fmt.Errorf("sink %s: give secret or secretFile, not both", s.Name)))
		}
		spec, err := s.spec("")
		if err == nil {
			err = sink.Check(spec)
		}
		if err != nil {
			errs = append(errs, c.sinkError(i, "url", err))
		}
	}
	return joinConfigErrors(errs...)
}

// spec is the sink package's view of s, with secret as its secret when
// s names none of its own.
func (s *SinkConfig) spec(secret string) (sink.Spec, error) {
	if s.URL == "" {
		return sink.Spec{}, fmt.Errorf("sink %s: no url", s.Name)
	}
	u, err := sink.ParseURL(s.URL)
	if err != nil {
		return sink.Spec{}, fmt.Errorf("sink %s: %w", s.Name, err)
	}
	spec := sink.Spec{Name: s.Name, URL: u, Secret: s.Secret, Options: s.Options}
	if secret != "" {
		spec.Secret = secret
	}
	if len(s.Topics) > 0 {
		spec.Topics = make(map[string]sink.TopicMap, len(s.Topics))
		for t, m := range s.Topics {
			if m == nil {
				m = &SinkTopicConfig{}
			}
			spec.Topics[t] = sink.TopicMap{Stream: m.Stream, Subject: m.Subject, Table: m.Table, Path: m.Path}
		}
	}
	return spec, nil
}

// sinkOpenTimeout bounds the opening of a sink's target at the start.
const sinkOpenTimeout = 10 * time.Second

// newSinks makes a runner per configured sink, opening its target (a
// target connects in its Resume, retried by the runner). A sink that
// cannot be made refuses the start before the database is claimed.
func (m *Main) newSinks() error {
	ctx, cancel := context.WithTimeout(context.Background(), sinkOpenTimeout)
	defer cancel()
	names := make([]string, len(m.Config.Sinks))
	for i, sc := range m.Config.Sinks {
		names[i] = sc.Name
	}
	// The backlog bound and pruning count the slowest of the relay and the
	// configured sinks, and only those.
	if err := m.Store.SetConsumers(ctx, m.Config.Relay.Mode != modeNone, names); err != nil {
		return err
	}
	for i := range m.Config.Sinks {
		sc := &m.Config.Sinks[i]
		secret := ""
		if sc.SecretFile != "" {
			b, err := os.ReadFile(sc.SecretFile)
			if err != nil {
				return configErr("sink %s: secretFile: %w", sc.Name, err)
			}
			if secret = strings.TrimSpace(string(b)); secret == "" {
				return configErr("sink %s: secretFile %s is empty", sc.Name, sc.SecretFile)
			}
		}
		spec, err := sc.spec(secret)
		if err != nil {
			return configErr("%w", err)
		}
		spec.Logger = m.Logger
		t, err := sink.Open(ctx, spec)
		if err != nil {
			return configErr("%w", err)
		}
		r, err := sink.NewRunner(m.Store, spec, t, sink.Config{Batch: sc.Batch})
		if err != nil {
			t.Close()
			return configErr("%w", err)
		}
		m.Sinks = append(m.Sinks, r)
	}
	return nil
}

// runSinks runs every sink until ctx is done, each on its own: one far
// behind or failing never holds back the others. The returned function
// waits for them to stop (close closes their targets).
func (m *Main) runSinks(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	if m.Relay == nil && len(m.Sinks) > 0 {
		wg.Go(func() { m.pruneForSinks(ctx) }) // the relay prunes when it runs
	}
	for _, r := range m.Sinks {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				m.Logger.Error("sink stopped", "sink", r.Name(), "err", err)
			}
		})
	}
	return wg.Wait
}

// closeSinks closes every sink's target.
func (m *Main) closeSinks() {
	for _, r := range m.Sinks {
		if err := r.Close(); err != nil {
			m.Logger.Warn("closing sink", "sink", r.Name(), "err", err)
		}
	}
}

// SinkStatuses returns every sink's status, by name.
func (m *Main) SinkStatuses() []sink.Status {
	out := make([]sink.Status, 0, len(m.Sinks))
	for _, r := range m.Sinks {
		out = append(out, r.Status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// pruneForSinks prunes, while no Kafka relay runs to do it, the rows every
// sink took longer than --outbox-retention ago, until ctx is done.
func (m *Main) pruneForSinks(ctx context.Context) {
	ret := m.Config.Relay.Retention
	t := time.NewTicker(min(max(ret/100, time.Second), time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		through := m.Store.ConsumedThrough()
		if through <= 0 {
			continue
		}
		n, err := m.Store.Prune(ctx, through, m.Store.Now().Add(-ret))
		switch {
		case err != nil && ctx.Err() == nil:
			m.Logger.Warn("pruning the rows the sinks took failed", "through", through, "err", err)
		case n > 0:
			m.Logger.Debug("pruned the rows the sinks took", "through", through, "rows", n)
		}
	}
}
