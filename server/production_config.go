package server

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/outbox"
)

// KafkaConfig is how every Kafka client of the server connects: the
// relay's producer, admin and progress clients, the Kafka feeds and their
// group committers, and the consume and produce commands. One set of
// settings, so they can never disagree.
type KafkaConfig struct {
	kafkasec.Config `yaml:",inline"`
	// Settings is Config resolved by ParseConfig: the certificates read,
	// the password read from its file or from OUTBOXD_KAFKA_SASL_PASSWORD.
	Settings kafkasec.Settings `yaml:"-"`
}

// flags registers the --kafka-* flags on fs. There is no flag for the
// password: a flag's value shows in ps.
func (k *KafkaConfig) flags(fs *flag.FlagSet) {
	t, s := &k.TLS, &k.SASL
	fs.BoolVar(&t.Enabled, "kafka-tls", t.Enabled, "connect to Kafka over TLS (implied by any --kafka-tls-* setting)")
	fs.StringVar(&t.CAFile, "kafka-tls-ca", t.CAFile, "PEM `FILE` of the CAs that sign the brokers' certificates (default: the system's)")
	fs.StringVar(&t.CertFile, "kafka-tls-cert", t.CertFile, "PEM client certificate `FILE`, for brokers that authenticate clients by certificate (mTLS)")
	fs.StringVar(&t.KeyFile, "kafka-tls-key", t.KeyFile, "PEM key `FILE` of --kafka-tls-cert")
	fs.StringVar(&t.ServerName, "kafka-tls-server-name", t.ServerName, "`NAME` the brokers' certificates must carry (default: each broker's host)")
	fs.BoolVar(&t.InsecureSkipVerify, "kafka-tls-insecure-skip-verify", t.InsecureSkipVerify,
		"accept any broker certificate: encrypted but not authenticated (for tests; a warning says so)")
	fs.StringVar(&s.Mechanism, "kafka-sasl-mechanism", s.Mechanism, "SASL `MECHANISM`: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default: no SASL)")
	fs.StringVar(&s.User, "kafka-sasl-user", s.User, "SASL `USER`")
	fs.StringVar(&s.PasswordFile, "kafka-sasl-password-file", s.PasswordFile,
		"`FILE` holding the SASL password (or set "+kafkasec.EnvPassword+"; there is no flag for it)")
}

// on reports whether any TLS or SASL is configured.
func (k KafkaConfig) on() bool { return k.TLS.On() || k.SASL.Mechanism != "" }

// validate checks the Kafka settings without reading a file; with no
// brokers, the dev broker serves plaintext only.
func (k KafkaConfig) validate(brokers []string) error {
	if err := k.Config.Validate(); err != nil {
		return err
	}
	if k.on() && len(brokers) == 0 {
		return errors.New("--kafka-tls*, --kafka-sasl-*: need --brokers (the dev broker started without them speaks plaintext)")
	}
	return nil
}

// resolve reads the files and the password of the settings.
func (k *KafkaConfig) resolve(getenv func(string) string) error {
	s, err := k.Config.Resolve(getenv)
	if err != nil {
		return err
	}
	k.Settings = s
	return nil
}

// warnKafka warns at start when the brokers' certificates are not
// verified; how the clients connect is in the start-up line.
func warnKafka(logger *slog.Logger, s kafkasec.Settings) {
	if s.Insecure() {
		logger.Warn("--kafka-tls-insecure-skip-verify: the brokers' certificates are NOT verified; " +
			"anyone on the path can pose as the cluster")
	}
}

// addProductionFlags registers the flags of the production settings:
// Kafka's TLS and SASL, the API's TLS, and the outbox backlog's bound.
func addProductionFlags(fs *flag.FlagSet, c *Config) {
	c.Kafka.flags(fs)
	c.HTTPTLS.flags(fs)
	c.Backlog.flags(fs)
	c.APITokens.flags(fs)
}

// validateProduction checks the production settings, naming each by its
// flag.
func (c *Config) validateProduction() error {
	if err := c.Kafka.validate(c.Brokers); err != nil {
		return err
	}
	if err := c.HTTPTLS.validate(); err != nil {
		return err
	}
	return c.Backlog.validate()
}

// resolveProduction reads what the production settings name: the Kafka
// certificates and password, the API's certificate.
func (c *Config) resolveProduction(getenv func(string) string) error {
	if err := c.Kafka.resolve(getenv); err != nil {
		return err
	}
	if err := c.APITokens.resolve(c.AdminToken); err != nil {
		return err
	}
	return c.HTTPTLS.resolve()
}

// HTTPTLSConfig serves the HTTP API over TLS, for deployments without a
// proxy in front.
type HTTPTLSConfig struct {
	CertFile string `yaml:"httpTLSCert"`
	KeyFile  string `yaml:"httpTLSKey"`
	// TLS is the listener's configuration once resolved; nil: plain HTTP.
	TLS *tls.Config `yaml:"-"`
}

func (h *HTTPTLSConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&h.CertFile, "http-tls-cert", h.CertFile, "PEM certificate (chain) `FILE` of the HTTP API: serve it over TLS (with --http-tls-key)")
	fs.StringVar(&h.KeyFile, "http-tls-key", h.KeyFile, "PEM key `FILE` of --http-tls-cert")
}

func (h HTTPTLSConfig) validate() error {
	if (h.CertFile == "") != (h.KeyFile == "") {
		return errors.New("--http-tls-cert and --http-tls-key: give both or neither")
	}
	return nil
}

func (h *HTTPTLSConfig) resolve() error {
	if h.CertFile == "" {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(h.CertFile, h.KeyFile)
	if err != nil {
		return fmt.Errorf("--http-tls-cert %s, --http-tls-key %s: %w", h.CertFile, h.KeyFile, err)
	}
	h.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	return nil
}

// Auto is --max-backlog-bytes's default: a quarter of the space free on
// the database's file system at start, at most AutoBacklogCap.
const Auto = "auto"

// AutoBacklogCap caps the automatic backlog bound: a backlog the relay
// drains in a few minutes once Kafka is back (figures: docs/performance.md).
const AutoBacklogCap = 16 << 30

// BacklogConfig bounds the outbox backlog (rows not yet published): past
// it ingest pauses (feed state backpressure) instead of filling the disk
// while Kafka is away, and resumes as the relay drains it.
type BacklogConfig struct {
	// MaxBytes is Auto, "0" for no bound, or a size: bytes, or a number
	// with KiB, MiB, GiB or TiB.
	MaxBytes string `yaml:"maxBacklogBytes"`
	// MaxRows bounds the rows too; 0: no bound.
	MaxRows int64 `yaml:"maxBacklogRows"`
}

func (b *BacklogConfig) flags(fs *flag.FlagSet) {
	if b.MaxBytes == "" {
		b.MaxBytes = Auto
	}
	fs.StringVar(&b.MaxBytes, "max-backlog-bytes", b.MaxBytes,
		"bound (`SIZE`) on the outbox backlog (rows not yet published): past it ingest pauses (state backpressure) until the relay "+
			"drains it; auto: a quarter of the disk space free at start, at most 16GiB; 0: no bound; or a size (e.g. 2GiB)")
	fs.Int64Var(&b.MaxRows, "max-backlog-rows", b.MaxRows, "bound (`N`) on the outbox backlog's rows (0: none)")
}

func (b BacklogConfig) validate() error {
	if _, _, err := b.bytes(); err != nil {
		return err
	}
	if b.MaxRows < 0 {
		return fmt.Errorf("--max-backlog-rows: %d is negative", b.MaxRows)
	}
	return nil
}

// bytes parses MaxBytes: auto, or n bytes (0: no bound).
func (b BacklogConfig) bytes() (n int64, auto bool, err error) {
	s := strings.TrimSpace(b.MaxBytes)
	if s == "" || strings.EqualFold(s, Auto) {
		return 0, true, nil
	}
	n, err = ParseSize(s)
	if err != nil {
		return 0, false, fmt.Errorf("--max-backlog-bytes %q: %w", b.MaxBytes, err)
	}
	return n, false, nil
}

// limit is the bound for a database in dir: MaxBytes, or for Auto a
// quarter of dir's free space at most AutoBacklogCap (the cap where the
// space is not measured), and none when the relay is off (nothing would
// drain it; an explicit bound still holds). how says where the figure
// came from, for the log.
func (b BacklogConfig) limit(dir string, relayOff bool) (lim outbox.BacklogLimit, how string, err error) {
	n, auto, err := b.bytes()
	if err != nil {
		return lim, "", err
	}
	lim.Rows = b.MaxRows
	if !auto {
		lim.Bytes = n
		return lim, "--max-backlog-bytes", nil
	}
	if relayOff {
		return lim, "none: the relay is off", nil
	}
	var free uint64
	var known bool
	if dir != "" {
		free, known, err = outbox.FreeSpace(dir)
	}
	switch {
	case err != nil:
		return lim, "", fmt.Errorf("--max-backlog-bytes auto: %w", err)
	case !known:
		lim.Bytes = AutoBacklogCap
		return lim, "auto: free space not measured here, the cap", nil
	}
	lim.Bytes = min(int64(free/4), AutoBacklogCap)
	return lim, fmt.Sprintf("auto: a quarter of the %s free, at most %s", ingest.FormatBytes(int64(free)),
		ingest.FormatBytes(AutoBacklogCap)), nil
}

// ParseSize reads a size: a number of bytes, or a number followed by
// KiB, MiB, GiB or TiB (also K, M, G, T, KB, MB, GB, TB, all powers of
// 1024; case does not matter).
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = strings.TrimSpace(s[:i]), strings.ToUpper(strings.TrimSpace(s[i:]))
	}
	mult, ok := map[string]float64{"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10,
		"M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
		"T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}[unit]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q (want KiB, MiB, GiB or TiB)", unit)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || num == "" {
		return 0, errors.New("want a size such as 1073741824, 512MiB or 2GiB")
	}
	if v := f * mult; v < float64(math.MaxInt64) {
		return int64(v), nil
	}
	return 0, errors.New("too large")
}
