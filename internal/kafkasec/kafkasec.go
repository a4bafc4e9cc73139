// Package kafkasec is how outboxd's Kafka clients connect: TLS (a CA, a
// client certificate, the server name) and SASL (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512). One Config is read once, resolved once into Settings, and
// Settings turns into sarama options (Settings.Sarama), so the relay's producer,
// its admin and progress clients, the Kafka feed, its group committer and
// the consume and produce tools always connect the same way.
//
// relay and ingest/kafkafeed both import it (they may not import each
// other); their configurations take a Settings value.
package kafkasec

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// SASL mechanisms accepted by SASLConfig.Mechanism.
const (
	MechanismPlain       = "PLAIN"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
)

// EnvPassword is the environment variable that may hold the SASL password
// (instead of SASLConfig.PasswordFile). There is no flag for it: a flag's
// value shows in ps.
const EnvPassword = "OUTBOXD_KAFKA_SASL_PASSWORD"

// Config is the Kafka connection settings as configured: paths, names and
// switches, no secret. The zero value is plaintext without SASL.
type Config struct {
	TLS  TLSConfig  `yaml:"tls"`
	SASL SASLConfig `yaml:"sasl"`
}

// TLSConfig says how to connect over TLS. TLS is on when Enabled is set or
// any other field is.
type TLSConfig struct {
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of the CAs that sign the brokers' certificates;
	// empty: the system's pool.
	CAFile string `yaml:"caFile"`
	// CertFile and KeyFile are the client's certificate and key (PEM),
	// for brokers that authenticate clients by certificate (mTLS). Both or
	// neither.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// ServerName is the name the brokers' certificates must carry; empty:
	// the host of each broker's address.
	ServerName string `yaml:"serverName"`
	// InsecureSkipVerify accepts any certificate the brokers present: the
	// connection is encrypted but not authenticated. For tests only; a
	// warning says so at start.
	InsecureSkipVerify bool `yaml:"insecureSkipVerify"`
}

// On reports whether TLS is used.
func (t TLSConfig) On() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// SASLConfig says how to authenticate with SASL. The password is read from
// PasswordFile, or from the environment (EnvPassword), never from a flag.
type SASLConfig struct {
	// Mechanism is MechanismPlain, MechanismSCRAMSHA256 or
	// MechanismSCRAMSHA512 (case does not matter); empty: no SASL.
	Mechanism    string `yaml:"mechanism"`
	User         string `yaml:"user"`
	PasswordFile string `yaml:"passwordFile"`
}

// Validate checks what can be checked without reading a file, naming each
// setting as its flag.
func (c Config) Validate() error {
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return errors.New("--kafka-tls-cert and --kafka-tls-key: give both (a client certificate and its key) or neither")
	}
	if c.SASL.Mechanism == "" {
		if c.SASL.User != "" || c.SASL.PasswordFile != "" {
			return errors.New("--kafka-sasl-user, --kafka-sasl-password-file: no --kafka-sasl-mechanism " +
				"(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return nil
	}
	if _, err := mechanism(c.SASL.Mechanism); err != nil {
		return err
	}
	if c.SASL.User == "" {
		return fmt.Errorf("--kafka-sasl-mechanism %s: no --kafka-sasl-user", c.SASL.Mechanism)
	}
	return nil
}

// mechanism returns the canonical name of m.
func mechanism(m string) (string, error) {
	switch u := strings.ToUpper(m); u {
	case MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512:
		return u, nil
	}
	return "", fmt.Errorf("--kafka-sasl-mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", m)
}

// Settings is a Config resolved: the TLS configuration built, the password
// read. The zero value connects in plaintext without SASL. A Settings is
// never modified once made and is safe to share.
type Settings struct {
	// TLS is the client's TLS configuration; nil: plaintext. Each client
	// gets a clone.
	TLS *tls.Config
	// SASL is the authentication; a zero Mechanism: none.
	SASL SASL
}

// SASL is a resolved SASL authentication.
type SASL struct {
	Mechanism string // one of the Mechanism constants, or "" for none
	User      string
	Password  Secret
}

// Secret is a string that never shows in a log, a format or JSON.
type Secret string

// String hides the secret.
func (s Secret) String() string { return redacted(s) }

// GoString hides the secret from %#v.
func (s Secret) GoString() string { return redacted(s) }

// LogValue hides the secret from slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted(s)) }

// MarshalText hides the secret from JSON, YAML and other encoders.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted(s)), nil }

func redacted(s Secret) string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// Resolve reads the files c names and the password (from c's password
// file, or from getenv(EnvPassword)) and returns the Settings. Every error
// names the setting, never the password.
func (c Config) Resolve(getenv func(string) string) (Settings, error) {
	if err := c.Validate(); err != nil {
		return Settings{}, err
	}
	var s Settings
	if c.TLS.On() {
		t, err := c.TLS.build()
		if err != nil {
			return Settings{}, err
		}
		s.TLS = t
	}
	if c.SASL.Mechanism != "" {
		m, _ := mechanism(c.SASL.Mechanism)
		pw, err := c.SASL.password(getenv)
		if err != nil {
			return Settings{}, err
		}
		s.SASL = SASL{Mechanism: m, User: c.SASL.User, Password: pw}
	}
	return s, nil
}

func (t TLSConfig) build() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--kafka-tls-ca %s: no PEM certificate in it", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert %s, --kafka-tls-key %s: %w", t.CertFile, t.KeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func (s SASLConfig) password(getenv func(string) string) (Secret, error) {
	env := getenv(EnvPassword)
	switch {
	case s.PasswordFile != "" && env != "":
		return "", fmt.Errorf("the SASL password is given twice: in --kafka-sasl-password-file and in %s; give one", EnvPassword)
	case env != "":
		return Secret(env), nil
	case s.PasswordFile == "":
		return "", fmt.Errorf("--kafka-sasl-mechanism %s: no password: give --kafka-sasl-password-file FILE or set %s",
			s.Mechanism, EnvPassword)
	}
	b, err := os.ReadFile(s.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("--kafka-sasl-password-file: %w", err)
	}
	// One line: the line's end is not part of the password; any other
	// space is.
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return "", fmt.Errorf("--kafka-sasl-password-file %s: empty", s.PasswordFile)
	}
	return Secret(pw), nil
}

// Principal is the principal Kafka's ACLs name this client by, as far as
// the client can tell: "User:NAME" under SASL; for a client certificate
// the broker derives it from the certificate's subject (by its
// ssl.principal.mapping.rules), shown here as that subject; "" when the
// client is anonymous.
func (s Settings) Principal() string {
	switch {
	case s.SASL.Mechanism != "":
		return "User:" + s.SASL.User
	case s.TLS != nil && len(s.TLS.Certificates) > 0 && s.TLS.Certificates[0].Leaf != nil:
		return "User:" + s.TLS.Certificates[0].Leaf.Subject.String()
	}
	return ""
}

// Describe says how the clients connect, for the start's log line; it
// never holds the password.
func (s Settings) Describe() string {
	var parts []string
	switch {
	case s.TLS == nil:
		parts = append(parts, "plaintext")
	case s.TLS.InsecureSkipVerify:
		parts = append(parts, "TLS without verifying the brokers' certificates")
	default:
		parts = append(parts, "TLS")
	}
	if s.TLS != nil && len(s.TLS.Certificates) > 0 {
		parts = append(parts, "client certificate")
	}
	if s.SASL.Mechanism != "" {
		parts = append(parts, "SASL "+s.SASL.Mechanism+" as "+s.SASL.User)
	}
	return strings.Join(parts, ", ")
}

// Insecure reports whether the brokers' certificates are not verified.
func (s Settings) Insecure() bool { return s.TLS != nil && s.TLS.InsecureSkipVerify }
