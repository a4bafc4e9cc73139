package kafkasec_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil/testcerts"
)

func noEnv(string) string { return "" }

func TestConfig_Validate(t *testing.T) {
	cases := []struct {
		name string
		cfg  kafkasec.Config
		want string // "" for valid
	}{
		{"Zero", kafkasec.Config{}, ""},
		{"CertWithoutKey", kafkasec.Config{TLS: kafkasec.TLSConfig{CertFile: "c.pem"}}, "--kafka-tls-cert and --kafka-tls-key"},
		{"KeyWithoutCert", kafkasec.Config{TLS: kafkasec.TLSConfig{KeyFile: "k.pem"}}, "--kafka-tls-cert and --kafka-tls-key"},
		{"UserWithoutMechanism", kafkasec.Config{SASL: kafkasec.SASLConfig{User: "u"}}, "no --kafka-sasl-mechanism"},
		{"UnknownMechanism", kafkasec.Config{SASL: kafkasec.SASLConfig{Mechanism: "GSSAPI", User: "u"}}, `--kafka-sasl-mechanism "GSSAPI"`},
		{"MechanismWithoutUser", kafkasec.Config{SASL: kafkasec.SASLConfig{Mechanism: "PLAIN"}}, "no --kafka-sasl-user"},
		{"LowerCaseMechanism", kafkasec.Config{SASL: kafkasec.SASLConfig{Mechanism: "scram-sha-512", User: "u"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Validate: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestConfig_ResolvePassword(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte(" s3cret word \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == kafkasec.EnvPassword {
				return v
			}
			return ""
		}
	}
	sasl := func(file string) kafkasec.Config {
		return kafkasec.Config{SASL: kafkasec.SASLConfig{Mechanism: "scram-sha-256", User: "alice", PasswordFile: file}}
	}
	t.Run("File", func(t *testing.T) {
		s, err := sasl(file).Resolve(noEnv)
		if err != nil {
			t.Fatal(err)
		}
		want := kafkasec.SASL{Mechanism: kafkasec.MechanismSCRAMSHA256, User: "alice", Password: " s3cret word "}
		if s.SASL != want {
			t.Fatalf("SASL = %#v, want the file's line without its end, spaces kept", s.SASL)
		}
	})
	t.Run("Env", func(t *testing.T) {
		s, err := sasl("").Resolve(env("from-env"))
		if err != nil || s.SASL.Password != "from-env" {
			t.Fatalf("Resolve = %v, %v; want the environment's password", s.SASL.Password == "from-env", err)
		}
	})
	for name, c := range map[string]struct {
		cfg  kafkasec.Config
		env  func(string) string
		want string
	}{
		"Both":      {sasl(file), env("x"), "given twice"},
		"Neither":   {sasl(""), noEnv, "no password"},
		"Empty":     {sasl(empty), noEnv, "empty"},
		"Missing":   {sasl(filepath.Join(dir, "nope")), noEnv, "--kafka-sasl-password-file"},
		"CAMissing": {kafkasec.Config{TLS: kafkasec.TLSConfig{CAFile: filepath.Join(dir, "nope")}}, noEnv, "--kafka-tls-ca"},
		"CANotPEM":  {kafkasec.Config{TLS: kafkasec.TLSConfig{CAFile: file}}, noEnv, "no PEM certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.cfg.Resolve(c.env)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Resolve: %v, want an error containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// The password never shows: not in fmt's verbs, slog, JSON.
func TestSecret_Redacted(t *testing.T) {
	s := kafkasec.Settings{SASL: kafkasec.SASL{Mechanism: "PLAIN", User: "alice", Password: "hunter2"}}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "settings", s, "password", s.SASL.Password)
	js, err := json.Marshal(s.SASL)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%+v", s), fmt.Sprintf("%#v", s), fmt.Sprintf("%v", s.SASL.Password),
		logged.String(), string(js), s.Describe()} {
		if strings.Contains(out, "hunter2") {
			t.Fatalf("the password shows in %q", out)
		}
	}
	if !strings.Contains(string(js), `"Password":"[redacted]"`) {
		t.Fatalf("JSON %s: want the password as [redacted]", js)
	}
}

// pki is a CA with a server certificate and a client certificate.
type pki struct {
	ca             *testcerts.CA
	server, client *testcerts.Pair
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server("broker")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := ca.Client("outboxd")
	if err != nil {
		t.Fatal(err)
	}
	return pki{ca, srv, cl}
}

// cluster starts a kfake broker on 127.0.0.1 with opts.
func cluster(t *testing.T, opts ...kfake.Opt) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.ListenFn(func(string, string) (net.Listener, error) { return ln, nil })}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return ln.Addr().String()
}

// dialBoth connects with sarama, asking for the topic's metadata, and
// with Check's own connection; it returns their errors.
func dialBoth(t *testing.T, addr string, s kafkasec.Settings) (saramaErr, checkErr error) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V3_6_0_0
	sc.Net.DialTimeout = 3 * time.Second
	sc.Metadata.Retry.Max = 0
	s.Sarama(sc)
	if cl, err := sarama.NewClient([]string{addr}, sc); err != nil {
		saramaErr = err
	} else {
		_, saramaErr = cl.Partitions("t")
		cl.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return saramaErr, s.Check(ctx, []string{addr})
}

func resolve(t *testing.T, c kafkasec.Config, password string) kafkasec.Settings {
	t.Helper()
	s, err := c.Resolve(func(k string) string {
		if k == kafkasec.EnvPassword {
			return password
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Both clients connect over TLS with each SASL mechanism, and both are
// refused with SASL_AUTHENTICATION_FAILED for a wrong password.
func TestSettings_TLSAndSASL(t *testing.T) {
	p := newPKI(t)
	addr := cluster(t, kfake.TLS(testcerts.ServerTLS(p.server, nil)), kfake.EnableSASL(),
		kfake.Superuser(kafkasec.MechanismPlain, "plain-user", "plain-pw"),
		kfake.Superuser(kafkasec.MechanismSCRAMSHA256, "scram256", "pw-256"),
		kfake.Superuser(kafkasec.MechanismSCRAMSHA512, "scram512", "pw-512"))
	users := map[string][2]string{
		kafkasec.MechanismPlain:       {"plain-user", "plain-pw"},
		kafkasec.MechanismSCRAMSHA256: {"scram256", "pw-256"},
		kafkasec.MechanismSCRAMSHA512: {"scram512", "pw-512"},
	}
	for mech, up := range users {
		cfg := kafkasec.Config{
			TLS:  kafkasec.TLSConfig{CAFile: p.ca.File},
			SASL: kafkasec.SASLConfig{Mechanism: mech, User: up[0]},
		}
		t.Run(mech, func(t *testing.T) {
			se, ke := dialBoth(t, addr, resolve(t, cfg, up[1]))
			if se != nil || ke != nil {
				t.Fatalf("sarama: %v; Check: %v; want both connected", se, ke)
			}
		})
		t.Run(mech+"/WrongPassword", func(t *testing.T) {
			s := resolve(t, cfg, "wrong")
			se, ke := dialBoth(t, addr, s)
			if se == nil || ke == nil {
				t.Fatalf("sarama: %v; Check: %v; want both refused", se, ke)
			}
			err := s.Check(context.Background(), []string{addr})
			var ae *kafkasec.AuthError
			if !errors.As(err, &ae) || !errors.Is(err, kafkasec.ErrRefused) || ae.Step != "sasl" {
				t.Fatalf("Check: %v, want a SASL *AuthError", err)
			}
			for _, want := range []string{mech, up[0], "wrong user or password", addr} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("Check: %q does not say %q", err, want)
				}
			}
		})
		t.Run(mech+"/Check", func(t *testing.T) {
			if err := resolve(t, cfg, up[1]).Check(context.Background(), []string{addr}); err != nil {
				t.Fatalf("Check: %v, want nil", err)
			}
		})
	}
	t.Run("UnknownCA", func(t *testing.T) {
		other := newPKI(t)
		cfg := kafkasec.Config{TLS: kafkasec.TLSConfig{CAFile: other.ca.File},
			SASL: kafkasec.SASLConfig{Mechanism: kafkasec.MechanismPlain, User: "plain-user"}}
		se, ke := dialBoth(t, addr, resolve(t, cfg, "plain-pw"))
		if se == nil || ke == nil {
			t.Fatalf("sarama: %v; Check: %v; want both to refuse a broker signed by another CA", se, ke)
		}
		err := resolve(t, cfg, "plain-pw").Check(context.Background(), []string{addr})
		var ae *kafkasec.AuthError
		if !errors.As(err, &ae) || ae.Step != "tls" || !strings.Contains(err.Error(), "not trusted") {
			t.Fatalf("Check: %v, want a TLS *AuthError saying the certificate is not trusted", err)
		}
	})
	t.Run("InsecureSkipVerify", func(t *testing.T) {
		cfg := kafkasec.Config{TLS: kafkasec.TLSConfig{InsecureSkipVerify: true},
			SASL: kafkasec.SASLConfig{Mechanism: kafkasec.MechanismPlain, User: "plain-user"}}
		s := resolve(t, cfg, "plain-pw")
		if !s.Insecure() {
			t.Fatal("Insecure() = false")
		}
		if se, ke := dialBoth(t, addr, s); se != nil || ke != nil {
			t.Fatalf("sarama: %v; Check: %v; want both connected without verifying", se, ke)
		}
	})
}

// A broker that requires a client certificate takes the configured one
// and refuses a client without.
func TestSettings_MutualTLS(t *testing.T) {
	p := newPKI(t)
	addr := cluster(t, kfake.TLS(testcerts.ServerTLS(p.server, p.ca)))
	with := resolve(t, kafkasec.Config{TLS: kafkasec.TLSConfig{CAFile: p.ca.File, CertFile: p.client.CertFile, KeyFile: p.client.KeyFile}}, "")
	if se, ke := dialBoth(t, addr, with); se != nil || ke != nil {
		t.Fatalf("with a client certificate: sarama: %v; Check: %v", se, ke)
	}
	if got := with.Principal(); got != "User:CN=outboxd" {
		t.Fatalf("Principal = %q, want User:CN=outboxd", got)
	}
	without := resolve(t, kafkasec.Config{TLS: kafkasec.TLSConfig{CAFile: p.ca.File}}, "")
	if se, ke := dialBoth(t, addr, without); se == nil || ke == nil {
		t.Fatalf("without a client certificate: sarama: %v; Check: %v; want both refused", se, ke)
	}
	if err := with.Check(context.Background(), []string{addr}); err != nil {
		t.Fatalf("Check with a client certificate: %v", err)
	}
	err := without.Check(context.Background(), []string{addr})
	var ae *kafkasec.AuthError
	if !errors.As(err, &ae) || ae.Step != "tls" {
		t.Fatalf("Check without a client certificate: %v, want a TLS *AuthError", err)
	}
}

// A broker that cannot be reached is not a refusal: the caller retries as
// for any outage.
func TestSettings_CheckUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := kafkasec.Settings{SASL: kafkasec.SASL{Mechanism: kafkasec.MechanismPlain, User: "u", Password: "p"}}
	err = s.Check(context.Background(), []string{addr})
	if err == nil || errors.Is(err, kafkasec.ErrRefused) {
		t.Fatalf("Check of a closed port: %v, want an error that is not ErrRefused", err)
	}
}

// A check without TLS against a TLS listener, which hangs up on the
// plaintext request, asks whether TLS is missing; it is no refusal.
func TestSettings_CheckTLSMissing(t *testing.T) {
	p := newPKI(t)
	addr := cluster(t, kfake.TLS(testcerts.ServerTLS(p.server, nil)), kfake.EnableSASL(),
		kfake.Superuser(kafkasec.MechanismPlain, "u", "p"))
	s := kafkasec.Settings{SASL: kafkasec.SASL{Mechanism: kafkasec.MechanismPlain, User: "u", Password: "p"}}
	err := s.Check(context.Background(), []string{addr})
	if err == nil || errors.Is(err, kafkasec.ErrRefused) || !strings.Contains(err.Error(), "is TLS missing (--kafka-tls)?") {
		t.Fatalf("Check of a TLS listener without TLS: %v, want an error asking whether TLS is missing", err)
	}
}
