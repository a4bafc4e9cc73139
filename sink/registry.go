package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Spec is one configured sink, as a target's constructor gets it.
type Spec struct {
	// Name names the sink: its progress, status and metrics go by it.
	Name string
	// URL is where the target is; its scheme picked the constructor.
	URL *url.URL
	// Topics maps each output topic the sink takes to where it goes in
	// the target. Empty: every topic, each with the target's default
	// mapping (a TopicMap with no field set).
	Topics map[string]TopicMap
	// Secret is the sink's secret, for targets that sign (webhooks).
	Secret string
	// Options are the target's own settings, by name (each target
	// documents the ones it reads and refuses the others).
	Options map[string]string
	// Logger is the sink's logger (never nil for a constructor).
	Logger *slog.Logger
}

// TopicMap is where one output topic goes in a target. Each target reads
// its own fields and documents the default of each one left empty.
type TopicMap struct {
	Stream  string // NATS JetStream: the stream
	Subject string // NATS JetStream: the subject
	Table   string // PostgreSQL: the table
	Path    string // webhooks: the path, joined to the sink's URL
}

// Takes reports whether the sink takes outputs of topic.
func (s Spec) Takes(topic string) bool {
	if len(s.Topics) == 0 {
		return true
	}
	_, ok := s.Topics[topic]
	return ok
}

// Topic is where topic goes in the target: its mapping, or the zero
// TopicMap (the target's defaults) for a sink that takes every topic.
func (s Spec) Topic(topic string) TopicMap { return s.Topics[topic] }

// Kind is what a target package registers for a URL scheme.
type Kind struct {
	// Check reports a mistake in spec without connecting to anything: a
	// start with a bad sink is refused before anything runs. nil: none.
	Check func(spec Spec) error
	// Open makes the target. It may connect, or leave connecting to the
	// target's Resume, which the runner retries with backoff.
	Open func(ctx context.Context, spec Spec) (Target, error)
}

var (
	kindsMu sync.RWMutex
	kinds   = map[string]Kind{}
)

// Register makes kind the target of URLs with scheme (lower case, such
// as "nats"). A target package calls it from its init function, so that
// importing the package is all a program does to offer it. It panics on a
// scheme registered twice or a kind without Open, mistakes of a program.
func Register(scheme string, kind Kind) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	scheme = strings.ToLower(scheme)
	if kind.Open == nil {
		panic(fmt.Sprintf("sink: Register(%q): no Open", scheme))
	}
	if _, dup := kinds[scheme]; dup {
		panic(fmt.Sprintf("sink: Register(%q) called twice", scheme))
	}
	kinds[scheme] = kind
}

// Schemes lists the registered URL schemes, sorted.
func Schemes() []string {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	out := make([]string, 0, len(kinds))
	for s := range kinds {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// ErrUnknownScheme is the error of a URL whose scheme no target registered.
var ErrUnknownScheme = errors.New("no sink target for this URL scheme")

// kindOf is the registered kind of spec's URL.
func kindOf(spec Spec) (Kind, error) {
	if spec.URL == nil {
		return Kind{}, fmt.Errorf("sink %s: no URL", spec.Name)
	}
	kindsMu.RLock()
	k, ok := kinds[strings.ToLower(spec.URL.Scheme)]
	kindsMu.RUnlock()
	if !ok {
		return Kind{}, fmt.Errorf("sink %s: %q: %w (registered: %s)", spec.Name, spec.URL.Scheme+"://",
			ErrUnknownScheme, strings.Join(Schemes(), ", "))
	}
	return k, nil
}

// Check reports a mistake in spec: a bad name, a URL whose scheme no
// target registered, or what the target's own Check finds.
func Check(spec Spec) error {
	if !ValidName(spec.Name) {
		return fmt.Errorf("sink %q: a name is letters, digits, '.', '_' and '-'", spec.Name)
	}
	k, err := kindOf(spec)
	if err != nil {
		return err
	}
	if k.Check != nil {
		if err := k.Check(spec); err != nil {
			return fmt.Errorf("sink %s: %w", spec.Name, err)
		}
	}
	return nil
}

// Open checks spec and makes its target with the constructor its URL's
// scheme registered.
func Open(ctx context.Context, spec Spec) (Target, error) {
	if err := Check(spec); err != nil {
		return nil, err
	}
	if spec.Logger == nil {
		spec.Logger = slog.Default()
	}
	k, _ := kindOf(spec)
	t, err := k.Open(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("sink %s: open %s target: %w", spec.Name, spec.URL.Scheme, err)
	}
	return t, nil
}

// ParseURL parses a sink's URL: an absolute URL with a scheme and a host.
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("%q: want SCHEME://HOST..., such as nats://127.0.0.1:4222", raw)
	}
	return u, nil
}

// ValidName reports whether s is a sink's name: letters, digits, '.', '_'
// and '-'.
func ValidName(s string) bool {
	return s != "" && !slices.ContainsFunc([]rune(s), func(r rune) bool {
		return !(r == '.' || r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	})
}
