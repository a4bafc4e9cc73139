package server

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/forward"
	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/orders"
)

// ProcessorSpec is what a processor factory is told about the feed it
// makes a processor for.
type ProcessorSpec struct {
	// Feed is the feed's name.
	Feed string
	// Processor is the name the processor was registered under.
	Processor string
	// Topic is the topic of the feed's outputs (feeds.NAME.topic,
	// NAME.out by default).
	Topic string
	// Kind is the feed's kind, ingest.KindFile or ingest.KindKafka, and
	// Target what it reads: the file's path or the topic.
	Kind, Target string
	// KeyField is feeds.NAME.keyField (0: none), for processors that key
	// their outputs by a CSV field.
	KeyField int
	// Logger is the service's logger.
	Logger *slog.Logger
	// Config is the whole service's configuration; a factory reads it and
	// never changes it.
	Config Config
}

// ProcessorFactory makes the processor of one feed. It runs once per feed
// when the server starts, before the database is claimed; an error stops
// the start with exit code 2 (ExitConfig), naming the feed. The processor
// it returns may implement ingest.Setupper (run in a transaction of its
// own when the feed starts) and the other optional interfaces of package
// ingest.
type ProcessorFactory func(ProcessorSpec) (ingest.Processor, error)

// Option changes how Command runs the service.
type Option func(*options)

// options are what Options set.
type options struct {
	procs *registry
}

// WithProcessor registers the processor factory f as name, so that
// --processor FEED=name (feeds.FEED.processor: name) makes the feed's
// processor with f. A name is letters, digits, '.', '_' and '-'; a later
// registration of a name wins over an earlier one, the built-ins' too.
// An invalid name or a nil f makes Command exit with code 2.
func WithProcessor(name string, f ProcessorFactory) Option {
	return func(o *options) { o.procs.add(name, f) }
}

// newOptions applies opts over the built-in processors.
func newOptions(opts []Option) *options {
	o := &options{procs: builtinRegistry()}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// registry is the processors a server knows, by name.
type registry struct {
	make map[string]ProcessorFactory
	// err is the first bad registration, reported when the server starts.
	err error
}

func (r *registry) add(name string, f ProcessorFactory) {
	switch {
	case r.err != nil:
	case !validName(name):
		r.err = fmt.Errorf("processor %q: a name is letters, digits, '.', '_' and '-'", name)
	case f == nil:
		r.err = fmt.Errorf("processor %s: no factory", name)
	default:
		r.make[name] = f
	}
}

// names lists the registered names, sorted.
func (r *registry) names() []string {
	out := make([]string, 0, len(r.make))
	for n := range r.make {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// check reports a processor name that is not registered, naming the
// registered ones.
func (r *registry) check(name string) error {
	if _, ok := r.make[name]; ok {
		return nil
	}
	return fmt.Errorf("unknown processor %q (registered: %s)", name, strings.Join(r.names(), ", "))
}

// builtinRegistry holds outboxd's own processors, registered as a caller's
// are.
func builtinRegistry() *registry {
	r := &registry{make: map[string]ProcessorFactory{}}
	r.add(ledger.Name, func(s ProcessorSpec) (ingest.Processor, error) { return ledger.New(s.Topic), nil })
	r.add(forward.Name, func(s ProcessorSpec) (ingest.Processor, error) { return forward.New(s.Topic, s.KeyField), nil })
	r.add(orders.Name, newOrders)
	return r
}

func newOrders(s ProcessorSpec) (ingest.Processor, error) {
	oc := orders.DefaultConfig(s.Feed, s.Target)
	oc.StatusTopic = s.Topic
	oc.RetryDelay, oc.RetryAttempts = s.Config.RetryDelay, s.Config.RetryAttempts
	oc.Logger = s.Logger
	return orders.New(oc)
}

// processors is the registry c was parsed with: the built-ins unless
// ParseConfig was given Options.
func (c *Config) processors() *registry {
	if c.procs == nil {
		return builtinRegistry()
	}
	return c.procs
}
