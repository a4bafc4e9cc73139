package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// FeedConfig is one feed's settings.
type FeedConfig struct {
	// Source is "file:PATH" (or "kafka:TOPIC").
	Source string `yaml:"source"`
	// Processor is a registered processor's name: "forward" (default),
	// "ledger", "orders" or one registered with WithProcessor.
	Processor string `yaml:"processor"`
	// Topic receives the processor's outputs (default NAME.out).
	Topic               string                  `yaml:"topic"`
	OnFailure           ingest.FailurePolicy    `yaml:"onFailure"`
	OnCompletionFailure ingest.CompletionPolicy `yaml:"onCompletionFailure"`
	// KeyField is forward's 1-based CSV key field (0: no key).
	KeyField int `yaml:"keyField"`
	// Group is a Kafka feed's consumer group (default outboxd-NAME).
	Group string `yaml:"group"`
	// KafkaGroup, when set, makes a Kafka feed join this consumer group,
	// which spreads its partitions over the servers sharing the
	// PostgreSQL database (docs/cluster.md); Group is then unused.
	KafkaGroup string `yaml:"kafkaGroup"`
	// OnProcessorChange is what a start does when the feed's state was
	// made by another processor: "" refuses (exit code 2), restart starts
	// the feed over from the beginning, keep keeps its state on purpose.
	OnProcessorChange string `yaml:"onProcessorChange"`
}

// Config is the whole service's configuration: defaults, then a YAML file
// (--config), then OUTBOXD_* environment variables, then flags.
type Config struct {
	DB   string `yaml:"db"`
	HTTP string `yaml:"http"`
	// AdminTokenFile holds the admin token (or set OUTBOXD_ADMIN_TOKEN);
	// AdminToken is what was read from either.
	AdminTokenFile string          `yaml:"adminTokenFile"`
	AdminToken     string          `yaml:"-"`
	Brokers        []string        `yaml:"brokers"`
	Synchronous    outbox.SyncMode `yaml:"synchronous"`
	BatchMax       int             `yaml:"batchMax"`
	BatchBytes     int             `yaml:"batchBytes"`
	BatchWait      time.Duration   `yaml:"batchWait"`
	MaxLine        int             `yaml:"maxLine"`
	// FileAssumeNoUnseenWrites: file feeds take bytes as written only while
	// they looked (filefeed.Options.AssumeNoUnseenWrites).
	FileAssumeNoUnseenWrites bool `yaml:"fileAssumeNoUnseenWrites"`
	// MaxMessageBytes bounds a Kafka record, for the relay and for the
	// copies of dead letters the loops emit.
	MaxMessageBytes int                    `yaml:"maxMessageBytes"`
	Grace           time.Duration          `yaml:"shutdownGrace"`
	LogLevel        string                 `yaml:"logLevel"`
	LogFormat       string                 `yaml:"logFormat"`
	Feeds           map[string]*FeedConfig `yaml:"feeds"`
	// Processors are the processors declared in the file (sql_processors.go).
	Processors map[string]*ProcessorConfig `yaml:"processors"`

	Relay RelayConfig `yaml:"relay"`
	// Sinks are the targets besides Kafka the outbox is relayed to
	// (sinks.go, docs/sinks.md).
	Sinks     []SinkConfig    `yaml:"sinks"`
	DevBroker DevBrokerConfig `yaml:"devBroker"`

	// Kafka, HTTPTLS and Backlog are the production settings: see
	// production_config.go.
	Kafka   KafkaConfig   `yaml:"kafka"`
	HTTPTLS HTTPTLSConfig `yaml:",inline"`
	// APITokens are the API's named tokens (api_tokens.go).
	APITokens APITokenConfig `yaml:",inline"`
	Backlog   BacklogConfig  `yaml:",inline"`

	// Record says which feeds are recorded (record_config.go).
	Record RecordConfig `yaml:"record"`
	Query  QueryConfig  `yaml:",inline"` // the state queries (queries.go)

	RetryDelay    time.Duration `yaml:"retryDelay"`
	RetryAttempts int           `yaml:"retryAttempts"`

	// NewDatabase starts a database that never published afresh although
	// the progress topic shows an earlier database at its path published
	// (relay.Config.NewDatabase). A decision for one start, so it is a
	// command-line flag only: neither the environment nor the file sets it.
	NewDatabase bool `yaml:"-"`
	// ServerID names this server among those sharing the database
	// (default HOST-PID).
	ServerID string `yaml:"serverId"`
	// RelayLease is how long the relay's leader holds its lease unless it
	// renews it, when servers share the database (docs/cluster.md).
	RelayLease time.Duration `yaml:"relayLease"`

	// procs are the processors feeds may name (ParseConfig's Options).
	procs *registry

	// origins says where each value set by the file, the environment or a
	// flag came from, by key path ("feeds.ledger.topic"); the others are
	// defaults.
	origins map[string]string
	// warnings are what the parse found worth saying but not fatal (a
	// deprecated key), logged once the logger exists.
	warnings []string
}

// setOrigin records where the value at key came from.
func (c *Config) setOrigin(key, origin string) {
	if c.origins == nil {
		c.origins = map[string]string{}
	}
	c.origins[key] = origin
}

// Origin says where the value at key (a key path such as "batchMax" or
// "feeds.ledger.topic") came from: "--FLAG", "OUTBOXD_VAR", "FILE:LINE",
// or "default".
func (c *Config) Origin(key string) string {
	if o, ok := c.origins[key]; ok {
		return o
	}
	return "default"
}

// Warnings are the parse's warnings (deprecated keys), one line each.
func (c *Config) Warnings() []string { return c.warnings }

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		DB:          "./data/outboxd.db",
		HTTP:        "127.0.0.1:8080",
		Synchronous: outbox.SyncFull,
		BatchMax:    ingest.DefaultConfig("").BatchMax,
		BatchBytes:  ingest.DefaultBatchBytes,
		BatchWait:   ingest.DefaultConfig("").BatchWait,
		MaxLine:     1 << 20,

		MaxMessageBytes: relay.DefaultMaxMessageBytes,
		Grace:           20 * time.Second,
		RelayLease:      5 * time.Second,
		LogLevel:        "info",
		LogFormat:       "text",
		Feeds:           map[string]*FeedConfig{},
		Record: RecordConfig{Feeds: map[string]string{}, MaxAge: DefaultRecordMaxAge, MaxTotalBytes: DefaultRecordMaxTotalBytes,
			SnapshotInterval: DefaultRecordSnapshotInterval},
		Relay:     DefaultRelayConfig(),
		DevBroker: DefaultDevBrokerConfig(),
		Query:     DefaultQueryConfig(),

		RetryDelay:    orders.DefaultRetryDelay,
		RetryAttempts: orders.DefaultRetryAttempts,
	}
}

// feed returns the named feed's settings, creating them.
func (c *Config) feed(name string) *FeedConfig {
	if c.Feeds == nil {
		c.Feeds = map[string]*FeedConfig{}
	}
	f, ok := c.Feeds[name]
	if !ok {
		f = &FeedConfig{}
		c.Feeds[name] = f
	}
	return f
}

// FeedNames returns the configured feeds' names, sorted.
func (c *Config) FeedNames() []string {
	names := make([]string, 0, len(c.Feeds))
	for n := range c.Feeds {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Shared reports whether the server shares its database with others: a
// feed of it joins a consumer group (--kafka-group).
func (c *Config) Shared() bool {
	for _, f := range c.Feeds {
		if f.KafkaGroup != "" {
			return true
		}
	}
	return false
}

// fillDefaults completes each feed's settings.
func (c *Config) fillDefaults() {
	c.fillProcessors()
	if len(c.Sinks) == 0 {
		c.Sinks = nil // "sinks: []" is none, as no key is
	}
	for name, f := range c.Feeds {
		if f.Processor == "" {
			f.Processor = "forward"
		}
		if f.Topic == "" && f.Processor == orders.Name {
			f.Topic = name + ".status"
		}
		if f.Topic == "" {
			f.Topic = name + ".out"
		}
		if f.Group == "" {
			f.Group = "outboxd-" + name
		}
		if f.OnFailure == "" {
			f.OnFailure = ingest.OnFailureDeadLetter
		}
		if f.OnCompletionFailure == "" {
			f.OnCompletionFailure = ingest.OnCompletionStop
		}
	}
}

// Validate reports every invalid setting (ConfigErrors when more than
// one), naming each as a flag, and, for a value set in the --config
// file, its line there.
func (c *Config) Validate() error {
	var errs []error
	add := func(err error) {
		var ce ConfigErrors
		switch {
		case errors.As(err, &ce):
			errs = append(errs, ce...) // located already
		case err != nil:
			errs = append(errs, c.located(err))
		}
	}
	if c.DB == "" {
		add(errors.New("--db: a path is required"))
	}
	if c.Synchronous != outbox.SyncFull && c.Synchronous != outbox.SyncNormal {
		add(fmt.Errorf("--synchronous: %q is not one of full, normal", c.Synchronous))
	}
	if c.BatchMax < 1 {
		add(fmt.Errorf("--batch-max: %d, want at least 1", c.BatchMax))
	}
	if c.BatchBytes < 1 {
		add(fmt.Errorf("--batch-bytes: %d, want at least 1", c.BatchBytes))
	}
	if c.BatchWait < 0 {
		add(fmt.Errorf("--batch-wait: %v is negative", c.BatchWait))
	}
	if c.MaxLine < 1 {
		add(fmt.Errorf("--max-line: %d, want at least 1", c.MaxLine))
	}
	if c.MaxMessageBytes < outbox.MinMessageBytes || c.MaxMessageBytes > relay.MaxMessageBytesLimit {
		add(fmt.Errorf("--max-message-bytes: %d, want %d to %d", c.MaxMessageBytes, outbox.MinMessageBytes, relay.MaxMessageBytesLimit))
	}
	if c.Grace <= orders.DefaultWorkDeadline {
		add(fmt.Errorf("--shutdown-grace: %v, want more than a record's work deadline (%v), so a shutdown never cuts one in half",
			c.Grace, orders.DefaultWorkDeadline))
	}
	if c.RetryDelay <= 0 || c.RetryAttempts < 1 {
		add(fmt.Errorf("--retry-delay %v, --retry-attempts %d: want a positive delay and at least 1 attempt", c.RetryDelay, c.RetryAttempts))
	}
	if c.RelayLease < time.Second {
		add(fmt.Errorf("--relay-lease: %v, want at least 1s", c.RelayLease))
	}
	add(checkAddr("--http", c.HTTP, true))
	for _, b := range c.Brokers {
		if err := checkAddr("--brokers", b, false); err != nil {
			add(err)
			break
		}
	}
	add(checkAddr("--dev-broker-addr", c.DevBroker.Addr, true))
	add(c.validateProcessors())
	for _, name := range c.FeedNames() {
		add(c.Feeds[name].validate(name, c))
	}
	add(c.validateProduction())
	add(c.Query.validate())
	add(c.Relay.Validate())
	add(c.validateSinks())
	return joinConfigErrors(errs...)
}

// flagRE finds the flag a validation error names first: "--batch-max",
// or a feed's "--processor NAME=" (or "feed NAME").
var flagRE = regexp.MustCompile(`^(?:--([a-z-]+)(?: ([A-Za-z0-9._-]+)=)?|feed ([A-Za-z0-9._-]+)\b)`)

// located adds to err, a validation error naming a flag, the file and
// line of the --config value it is about, when the file set it.
func (c *Config) located(err error) error {
	m := flagRE.FindStringSubmatch(err.Error())
	if m == nil {
		return c.locatedSection(err)
	}
	key := ""
	switch {
	case m[3] != "": // feed NAME: the feed's entry
		key = feedsKey + "." + m[3] + ".source"
	case m[1] != "":
		key = flagKey(m[1])
		if m[2] != "" {
			key = strings.Replace(key, nameHolder, m[2], 1)
		}
	}
	path, line, ok := fileOrigin(c.Origin(key))
	if !ok {
		return err
	}
	if rest, ok := strings.CutPrefix(err.Error(), m[0]); ok && m[1] != "" {
		if _, value, ok := strings.Cut(rest, ": "); ok || m[2] == "" {
			if m[2] == "" {
				value = strings.TrimPrefix(rest, ": ")
			}
			return &FileError{Path: path, Line: line, Key: key, Msg: value}
		}
	}
	return &FileError{Path: path, Line: line, Msg: err.Error()}
}

// sectionRE finds the section entry a validation error names first
// ("processors.balances: ...").
var sectionRE = regexp.MustCompile(`^([a-zA-Z]+\.[A-Za-z0-9._-]+?): `)

// fieldRE finds the field of a section a validation error names first
// ("relay: mode: ...").
var fieldRE = regexp.MustCompile(`^([a-zA-Z]+): ([a-zA-Z]+): `)

// locatedSection adds to err, naming an entry of a section of the file,
// the file and the first line the entry set.
func (c *Config) locatedSection(err error) error {
	if m := fieldRE.FindStringSubmatch(err.Error()); m != nil {
		if p, l, ok := fileOrigin(c.Origin(m[1] + "." + m[2])); ok {
			return &FileError{Path: p, Line: l, Key: m[1] + "." + m[2], Msg: strings.TrimPrefix(err.Error(), m[0])}
		}
	}
	m := sectionRE.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	rest := strings.TrimPrefix(err.Error(), m[0])
	field := rest[:len(rest)-len(strings.TrimLeft(rest, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))]
	if p, l, ok := fileOrigin(c.Origin(m[1] + "." + field)); ok && field != "" {
		return &FileError{Path: p, Line: l, Msg: err.Error()} // the line of the field it is about
	}
	path, line := "", 0
	for k, o := range c.origins {
		if k != m[1] && !strings.HasPrefix(k, m[1]+".") {
			continue
		}
		if p, l, ok := fileOrigin(o); ok && (line == 0 || l < line) {
			path, line = p, l
		}
	}
	if line == 0 {
		return err
	}
	return &FileError{Path: path, Line: line, Msg: err.Error()}
}

// flagKey is the YAML key path the service's flag name sets ("" for none).
func flagKey(name string) string {
	c := DefaultConfig()
	var p string
	fs := flagSet(&c, &p, &givenSettings{})
	if l := bindings(&c, fs)[name]; l != nil {
		return l.key
	}
	return ""
}

// fileOrigin splits an origin "FILE:LINE" (Config.Origin).
func fileOrigin(o string) (string, int, bool) {
	i := strings.LastIndexByte(o, ':')
	if i <= 0 {
		return "", 0, false
	}
	line, err := strconv.Atoi(o[i+1:])
	if err != nil || strings.HasPrefix(o, "--") || strings.HasPrefix(o, "OUTBOXD_") {
		return "", 0, false
	}
	return o[:i], line, true
}

// checkAddr checks addr is HOST:PORT with a port number (0, for a
// listener that may pick one, when zeroPort), naming the flag.
func checkAddr(flagName, addr string, zeroPort bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT", flagName, addr)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	switch {
	case err != nil, n == 0 && !zeroPort:
		return fmt.Errorf("%s %q: the port %q is not a number from 1 to 65535", flagName, addr, port)
	case host == "" && !zeroPort:
		return fmt.Errorf("%s %q: no host", flagName, addr)
	}
	return nil
}

// validate reports every invalid setting of the feed (ConfigErrors when
// more than one).
func (f *FeedConfig) validate(name string, c *Config) error {
	if !validName(name) {
		return fmt.Errorf("feed %q: a name is letters, digits, '.', '_' and '-'", name)
	}
	var errs []error
	add := func(err error) { errs = append(errs, c.located(err)) }
	kind, target, ok := strings.Cut(f.Source, ":")
	switch {
	case f.Source == "":
		add(fmt.Errorf("feed %s: no source: give --feed %s=file:PATH or kafka:TOPIC", name, name))
	case !ok || target == "":
		add(fmt.Errorf("--feed %s=%s: want file:PATH or kafka:TOPIC", name, f.Source))
	case kind != "file" && kind != "kafka":
		add(fmt.Errorf("--feed %s=%s: unknown feed kind %q (want file or kafka)", name, f.Source, kind))
	case f.Processor == orders.Name && kind != "kafka":
		add(fmt.Errorf("--processor %s=orders: the orders processor reads a Kafka feed (--feed %s=kafka:TOPIC)", name, name))
	}
	if !c.declaredProcessor(f.Processor) && c.processors().check(f.Processor) != nil {
		add(fmt.Errorf("--processor %s=%s: unknown processor %q (registered: %s)", name, f.Processor, f.Processor, c.processorNames()))
	}
	switch f.OnFailure {
	case ingest.OnFailureDeadLetter, ingest.OnFailureStop:
	default:
		add(fmt.Errorf("--on-failure %s=%s: want dead-letter or stop", name, f.OnFailure))
	}
	switch f.OnCompletionFailure {
	case ingest.OnCompletionStop, ingest.OnCompletionSkip:
	default:
		add(fmt.Errorf("--on-completion-failure %s=%s: want stop or skip", name, f.OnCompletionFailure))
	}
	if f.KafkaGroup != "" {
		switch {
		case kind != "kafka":
			add(fmt.Errorf("--kafka-group %s=%s: only a Kafka feed (--feed %s=kafka:TOPIC) joins a consumer group", name, f.KafkaGroup, name))
		case !outbox.IsPostgres(c.DB):
			add(fmt.Errorf("--kafka-group %s=%s: servers share a feed only on a PostgreSQL --db (postgres://...)", name, f.KafkaGroup))
		}
	}
	if f.KeyField < 0 {
		add(fmt.Errorf("--key-field %s=%d: want 0 (no key) or a 1-based field", name, f.KeyField))
	}
	switch f.OnProcessorChange {
	case "", processorChangeRestart, processorChangeKeep:
	default:
		add(fmt.Errorf("--on-processor-change %s=%s: want restart or keep", name, f.OnProcessorChange))
	}
	return joinConfigErrors(errs...)
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		ok := r == '.' || r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// perFeed is a repeatable flag NAME=VALUE that sets the field of a feed's
// settings whose YAML key is key, parsed as the file's value would be.
type perFeed struct {
	cfg   *Config
	flag  string
	key   string // the FeedConfig field's YAML key
	def   string // the default, as help shows it
	given *givenSettings
}

// String is the documented default (the flag package shows it as such).
func (p perFeed) String() string { return p.def }

func (p perFeed) Set(s string) error {
	name, v, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want NAME=VALUE", s)
	}
	if err := p.given.give(p.flag, name, v); err != nil {
		return err
	}
	f := fieldAt(reflect.ValueOf(p.cfg.feed(name)).Elem(), p.key)
	if !f.IsValid() {
		return fmt.Errorf("feeds have no setting %q", p.key)
	}
	return setText(f, v)
}

// feedName is the feed a NAME=VALUE setting names.
func (p perFeed) feedName(s string) string {
	name, _, _ := strings.Cut(s, "=")
	return name
}

// givenSettings remembers the per-feed settings one source (the
// environment, the command line) gave, so that a feed's setting given
// twice there with different values is an error naming the feed, not a
// silent "the last one wins". Across sources the precedence rules apply.
type givenSettings struct {
	source string
	values map[string]string // flag name, NUL, feed name -> value
}

// begin starts a new source.
func (g *givenSettings) begin(source string) {
	g.source, g.values = source, map[string]string{}
}

func (g *givenSettings) give(flagName, feed, v string) error {
	if g.values == nil {
		g.values = map[string]string{}
	}
	k := flagName + "\x00" + feed
	if prev, ok := g.values[k]; ok && prev != v {
		return fmt.Errorf("feed %s: --%s given twice in %s (%q, then %q)", feed, flagName, g.source, prev, v)
	}
	g.values[k] = v
	return nil
}

// list is a comma-separated flag.
type list struct{ p *[]string }

func (l list) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l list) Set(s string) error {
	*l.p = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l.p = append(*l.p, v)
		}
	}
	return nil
}

// flagSet binds every flag to c; given tracks the per-feed settings. A
// flag bound to a field of Config (fs.IntVar(&c.X, ...)) is that field's
// flag everywhere: in the file (by the field's yaml tag), the environment,
// the help, docs/configuration.md's table and `server config`. Back-quoted words in
// the help name the flag's value.
func flagSet(c *Config, configPath *string, given *givenSettings) *flag.FlagSet {
	fs := flag.NewFlagSet(programName, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	perFeedFlag := func(name, key, def, usage string) {
		fs.Var(perFeed{cfg: c, flag: name, key: key, def: def, given: given}, name, usage)
	}
	fs.StringVar(configPath, "config", "", "YAML configuration `FILE` (flags and OUTBOXD_* variables override it)")
	fs.StringVar(&c.DB, "db", c.DB, "SQLite database `PATH`; its directory is created")
	fs.StringVar(&c.HTTP, "http", c.HTTP, "listen address (`ADDR`) of the HTTP API")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", c.AdminTokenFile,
		"`FILE` holding the bearer token of the HTTP admin endpoints (or set "+api.EnvAdminToken+"); none: they answer 403")
	fs.Var(list{&c.Brokers}, "brokers", "Kafka brokers, a comma-separated `LIST` of HOST:PORT (none: an in-process dev broker)")
	fs.StringVar((*string)(&c.Synchronous), "synchronous", string(c.Synchronous), "SQLite synchronous `MODE`: full (a commit survives power loss) or normal (survives a process crash only)")
	fs.IntVar(&c.BatchMax, "batch-max", c.BatchMax, "close an ingest batch (one transaction) at `N` items")
	fs.IntVar(&c.BatchBytes, "batch-bytes", c.BatchBytes, "... or once its items hold `N` bytes (for a file feed, at most N plus one line)")
	fs.DurationVar(&c.BatchWait, "batch-wait", c.BatchWait, "... or this long (`D`) after its first item")
	fs.IntVar(&c.MaxLine, "max-line", c.MaxLine, "longest file line in bytes (`N`); longer lines are dead letters")
	fs.BoolVar(&c.FileAssumeNoUnseenWrites, "file-assume-no-unseen-writes", c.FileAssumeNoUnseenWrites,
		"a file truncated with no copy, or gone while the server was down, after every byte seen was read, records no loss "+
			"(default: a loss of unknown extent, as bytes written while the feed was not looking cannot be ruled out)")
	fs.IntVar(&c.MaxMessageBytes, "max-message-bytes", c.MaxMessageBytes,
		"largest Kafka record batch the relay sends, `N` bytes from 4096 to 67108864 (keep it at or below the brokers' message.max.bytes): "+
			"a larger output is a dead letter output-too-large, a dead letter's copy is cut to fit")
	fs.DurationVar(&c.Grace, "shutdown-grace", c.Grace, "on SIGTERM, exit within this long (`D`; more than a record's 15s work deadline)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log `LEVEL`: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log `FORMAT`: text or json")
	perFeedFlag("feed", "source", "", "a feed to read (repeatable): `NAME=file:PATH`, or NAME=kafka:TOPIC for every partition of TOPIC")
	perFeedFlag("processor", "processor", "forward", "the feed's processor, `NAME=P`: P is a registered processor (built in: ledger, forward, orders) or one of the file's processors section (SQL processors)")
	perFeedFlag("topic", "topic", "NAME.out", "the topic of the feed's outputs, `NAME=TOPIC` (NAME.status for orders)")
	perFeedFlag("on-failure", "onFailure", string(ingest.OnFailureDeadLetter),
		"an item whose retries are spent, `NAME=P`: dead-letter, or stop (the feed stalls and retries it)")
	perFeedFlag("on-completion-failure", "onCompletionFailure", string(ingest.OnCompletionStop),
		"a batch whose commit keeps failing, `NAME=P`: stop (the feed stalls and retries) or skip (only what cannot commit alone is skipped)")
	perFeedFlag("key-field", "keyField", "0", "forward keys each output by the line's N-th CSV field, `NAME=N` (0: no key)")
	fs.DurationVar(&c.RetryDelay, "retry-delay", c.RetryDelay, "orders: wait (`D`) before a refused event comes back (doubles per attempt)")
	fs.IntVar(&c.RetryAttempts, "retry-attempts", c.RetryAttempts, "orders: tries (`N`) of a refused event before it is a dead letter")
	perFeedFlag("group", "group", "outboxd-NAME", "a Kafka feed's consumer group, `NAME=G`, where its offsets are committed for Kafka's tools")
	perFeedFlag("kafka-group", "kafkaGroup", "", "a Kafka feed shared by servers, `NAME=G`: it joins consumer group G, which spreads its "+
		"partitions over the servers on one PostgreSQL --db; positions stay in the database (docs/cluster.md)")
	fs.StringVar(&c.ServerID, "server-id", c.ServerID, "this server's `ID` among the servers sharing the database (default HOST-PID)")
	fs.DurationVar(&c.RelayLease, "relay-lease", c.RelayLease, "servers sharing the database: the relay leader's lease (`D`), "+
		"renewed every third of it; another server's relay takes over once it expires")
	perFeedFlag("on-processor-change", "onProcessorChange", "",
		"a feed whose state another processor made, `NAME=P`: restart (read its source again from the beginning) or keep "+
			"(keep its position and state); none: the start is refused; recorded, so needed once")
	c.Relay.flags(fs)
	fs.Var(sinkFlag{c}, "sink", "relay the outbox also to the sink `NAME=URL` (repeatable): the scheme picks the target, "+
		"nats:// (JetStream), postgres:// (a table), https:// or http:// (webhooks); every topic unless the file's sinks entry NAME maps some (docs/sinks.md)")
	c.DevBroker.flags(fs)
	addProductionFlags(fs, c)
	c.Record.flags(fs)
	c.Query.flags(fs)
	fs.BoolVar(&c.NewDatabase, "new-database", c.NewDatabase,
		"start afresh although an earlier database at this --db path published: every output is published again "+
			"(see docs/guarantees.md; command line only, recorded in the database, so needed once)")
	return fs
}

// cmdlineOnly names the flags the environment does not set.
var cmdlineOnly = map[string]bool{"new-database": true}

// ParseConfig reads the configuration from a YAML file, the environment
// (OUTBOXD_ plus the flag's name in capitals, '-' as '_'; repeatable flags
// take comma-separated values) and the command line, in that order, and
// remembers where each value came from (Config.Origin). A mistake in any
// of them is an error naming it: the file's errors name the line and the
// key, and an unknown key or flag names the closest known one. opts
// register the processors feeds may name besides the built-ins
// (WithProcessor).
func ParseConfig(args []string, getenv func(string) string, opts ...Option) (Config, error) {
	c := DefaultConfig()
	if len(opts) > 0 { // none: the built-ins, left implicit
		if c.procs = newOptions(opts).procs; c.procs.err != nil {
			return c, c.procs.err
		}
	}
	c.origins = map[string]string{}
	var configPath string
	var given givenSettings
	fs := flagSet(&c, &configPath, &given)
	src := trackOrigins(&c, fs)
	configPath = findConfigPath(args, getenv)
	// The file's mistakes are all reported, with those of the values
	// checked after it; the file's syntax, the environment and the command
	// line stop the parse at their first.
	var fileErr error
	if configPath != "" {
		if err := loadYAML(configPath, &c); err != nil {
			var fe *FileError
			if errors.As(err, &fe) && fe.syntax || !errors.As(err, &fe) {
				return c, err
			}
			fileErr = err
		}
	}
	given.begin("the environment")
	if err := applyEnv(fs, getenv, src); err != nil {
		return c, joinConfigErrors(fileErr, err)
	}
	given.begin("the command line")
	src.fromEnv = false
	if err := fs.Parse(args); err != nil {
		return c, joinConfigErrors(fileErr, flagError(fs, err))
	}
	if fs.NArg() > 0 {
		return c, joinConfigErrors(fileErr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	c.fillDefaults()
	tok, err := api.LoadAdminToken(c.AdminTokenFile, getenv)
	if err != nil {
		return c, joinConfigErrors(fileErr, err)
	}
	c.AdminToken = tok
	if err := joinConfigErrors(fileErr, c.Validate()); err != nil {
		return c, byLine(err)
	}
	return c, c.resolveProduction(getenv)
}

// flagError adds to the flag package's "flag provided but not defined"
// the closest flag there is.
func flagError(fs *flag.FlagSet, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known["--"+f.Name] = true })
	return fmt.Errorf("unknown flag --%s (the closest is %s)", name, closest("--"+name, known))
}

// origins tracks which source the flags are being set from.
type origins struct{ fromEnv bool }

// trackOrigins wraps every flag of fs so that setting it records, in
// c.origins, the key it set and from where; and so that a value that does
// not parse says what was expected.
func trackOrigins(c *Config, fs *flag.FlagSet) *origins {
	src := &origins{fromEnv: true}
	bound := bindings(c, fs)
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &tracked{Value: f.Value, name: f.Name, leaf: bound[f.Name], c: c, src: src}
	})
	return src
}

// tracked is a flag.Value that records where its setting came from.
type tracked struct {
	flag.Value
	name string
	leaf *leaf // nil for a flag that sets no key
	c    *Config
	src  *origins
}

// IsBoolFlag keeps a boolean flag usable without a value.
func (t *tracked) IsBoolFlag() bool {
	b, ok := t.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (t *tracked) Set(s string) error {
	if err := t.Value.Set(s); err != nil {
		var ve *valueError
		if t.leaf != nil && !errors.As(err, &ve) && strings.Contains(err.Error(), "parse error") {
			return &valueError{text: s, want: wantOf(t.leaf.typ)}
		}
		return err
	}
	if t.leaf == nil {
		return nil
	}
	key := t.leaf.key
	if pf, ok := t.Value.(perFeed); ok {
		key = strings.Replace(key, nameHolder, pf.feedName(s), 1)
	}
	origin := "--" + t.name
	if t.src.fromEnv {
		origin = envName(t.name)
	}
	t.c.setOrigin(key, origin)
	return nil
}

func findConfigPath(args []string, getenv func(string) string) string {
	path := getenv("OUTBOXD_CONFIG")
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "config="); ok {
			path = v
		} else if a == "config" && i+1 < len(args) {
			path = args[i+1]
		}
	}
	return path
}

// repeatable reports whether a flag's environment value is a
// comma-separated list of NAME=VALUE settings.
func repeatable(f *flag.Flag) bool {
	v := f.Value
	if t, ok := v.(*tracked); ok {
		v = t.Value
	}
	if _, ok := v.(interface{ repeatable() }); ok {
		return true
	}
	_, ok := v.(perFeed)
	return ok
}

func applyEnv(fs *flag.FlagSet, getenv func(string) string, src *origins) error {
	src.fromEnv = true
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || f.Name == "config" || cmdlineOnly[f.Name] {
			return // OUTBOXD_CONFIG is read first, by findConfigPath
		}
		key := envName(f.Name)
		v := getenv(key)
		if v == "" {
			return
		}
		vals := []string{v}
		if repeatable(f) {
			vals = strings.Split(v, ",")
		}
		for _, s := range vals {
			if serr := fs.Set(f.Name, strings.TrimSpace(s)); serr != nil {
				err = fmt.Errorf("%s=%s: %w", key, v, serr)
				return
			}
		}
	})
	return err
}

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return "OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// topics are the Kafka topics the feed named name writes: its outputs,
// its dead letters and, for orders, its retry topic.
func (f *FeedConfig) topics(name string) []string {
	t := []string{f.Topic, name + ".dlq"}
	if f.Processor == orders.Name {
		t = append(t, name+".retry")
	}
	return t
}
