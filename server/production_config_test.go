package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil/testcerts"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

func TestParseConfig_Kafka(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "k")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Client("outboxd")
	if err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--feed", "l=file:/tmp/l.csv", "--brokers", "kafka-1:9093"}
	t.Run("Flags", func(t *testing.T) {
		c, err := ParseConfig(append(base, "--kafka-tls-ca", ca.File, "--kafka-tls-cert", client.CertFile,
			"--kafka-tls-key", client.KeyFile, "--kafka-tls-server-name", "kafka.example",
			"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", "svc", "--kafka-sasl-password-file", pw), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		s := c.Kafka.Settings
		if s.TLS == nil || s.TLS.ServerName != "kafka.example" || len(s.TLS.Certificates) != 1 || s.TLS.RootCAs == nil {
			t.Fatalf("TLS %+v", s.TLS)
		}
		if s.SASL != (kafkasec.SASL{Mechanism: kafkasec.MechanismSCRAMSHA512, User: "svc", Password: "file-secret"}) {
			t.Fatalf("SASL %#v", s.SASL)
		}
	})
	t.Run("EnvAndFile", func(t *testing.T) {
		yml := filepath.Join(dir, "c.yaml")
		os.WriteFile(yml, []byte("brokers: [k:9093]\nkafka:\n  tls:\n    caFile: "+ca.File+"\n  sasl:\n    mechanism: PLAIN\n    user: from-file\n"), 0o644)
		c, err := ParseConfig([]string{"--config", yml, "--feed", "l=file:/tmp/l.csv"}, env(map[string]string{
			kafkasec.EnvPassword: "env-secret", "OUTBOXD_KAFKA_SASL_USER": "from-env"}))
		if err != nil {
			t.Fatal(err)
		}
		if s := c.Kafka.Settings; s.TLS == nil || s.SASL != (kafkasec.SASL{Mechanism: "PLAIN", User: "from-env", Password: "env-secret"}) {
			t.Fatalf("settings %#v", s)
		}
		if u := UnknownEnvs([]string{kafkasec.EnvPassword + "=x", "OUTBOXD_KAFKA_TLS_CA=x"}); len(u) != 0 {
			t.Fatalf("unknown %+v: the password's variable and the flags' are known", u)
		}
	})
	for name, c := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"NoPasswordFlag":  {[]string{"--kafka-sasl-password", "x"}, nil, "unknown flag --kafka-sasl-password "},
		"NoPassword":      {[]string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u"}, nil, "no password"},
		"TwoPasswords":    {[]string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", pw}, map[string]string{kafkasec.EnvPassword: "y"}, "given twice"},
		"BadMechanism":    {[]string{"--kafka-sasl-mechanism", "KERBEROS", "--kafka-sasl-user", "u"}, nil, `--kafka-sasl-mechanism "KERBEROS"`},
		"CertWithoutKey":  {[]string{"--kafka-tls-cert", client.CertFile}, nil, "give both"},
		"MissingCA":       {[]string{"--kafka-tls-ca", filepath.Join(dir, "nope.pem")}, nil, "--kafka-tls-ca"},
		"HTTPCertNoKey":   {[]string{"--http-tls-cert", client.CertFile}, nil, "--http-tls-cert and --http-tls-key"},
		"HTTPBadCert":     {[]string{"--http-tls-cert", pw, "--http-tls-key", pw}, nil, "--http-tls-cert"},
		"BadBacklog":      {[]string{"--max-backlog-bytes", "lots"}, nil, `--max-backlog-bytes "lots"`},
		"NegativeRows":    {[]string{"--max-backlog-rows", "-1"}, nil, "--max-backlog-rows"},
		"SecurityDevOnly": {[]string{"--kafka-tls"}, nil, "need --brokers"},
	} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"--feed", "l=file:/tmp/l.csv"}, c.args...)
			if name != "SecurityDevOnly" {
				args = append(args, "--brokers", "k:9093")
			}
			_, err := ParseConfig(args, env(c.env))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParseConfig: %v, want an error containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "file-secret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
	t.Run("HTTPTLS", func(t *testing.T) {
		srv, err := ca.Server("api")
		if err != nil {
			t.Fatal(err)
		}
		c, err := ParseConfig([]string{"--feed", "l=file:/tmp/l.csv", "--http-tls-cert", srv.CertFile, "--http-tls-key", srv.KeyFile}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.HTTPTLS.TLS == nil || len(c.HTTPTLS.TLS.Certificates) != 1 {
			t.Fatalf("HTTP TLS %+v", c.HTTPTLS.TLS)
		}
	})
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1073741824": 1 << 30, "512MiB": 512 << 20, "2GiB": 2 << 30,
		"2 gib": 2 << 30, "1.5G": 3 << 29, "64KiB": 64 << 10, "1TiB": 1 << 40, "10B": 10} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "1XB", "1e30GiB", "lots"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestBacklogConfig_Limit(t *testing.T) {
	dir := t.TempDir()
	c, err := ParseConfig([]string{"--feed", "l=file:/tmp/l.csv", "--max-backlog-rows", "500"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Backlog.MaxBytes != Auto {
		t.Fatalf("default %q, want auto", c.Backlog.MaxBytes)
	}
	free, known, err := outbox.FreeSpace(dir)
	if err != nil {
		t.Fatal(err)
	}
	lim, how, err := c.Backlog.limit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(AutoBacklogCap)
	if known {
		want = min(int64(free/4), AutoBacklogCap)
	}
	// The free space moves while the test runs: within a MiB.
	if d := lim.Bytes - want; lim.Rows != 500 || d > 1<<20 || d < -(1<<20) {
		t.Fatalf("auto: %+v (%s), want %d bytes, 500 rows", lim, how, want)
	}
	if lim, _, _ := c.Backlog.limit(dir, true); lim != (outbox.BacklogLimit{Rows: 500}) {
		t.Fatalf("auto with the relay off: %+v, want no byte bound", lim)
	}
	for in, want := range map[string]int64{"0": 0, "3GiB": 3 << 30} {
		c, err := ParseConfig([]string{"--feed", "l=file:/tmp/l.csv", "--max-backlog-bytes", in}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if lim, _, _ := c.Backlog.limit(dir, true); lim.Bytes != want {
			t.Fatalf("--max-backlog-bytes %s: %+v, want %d (an explicit bound holds with the relay off too)", in, lim, want)
		}
	}
	yml := filepath.Join(dir, "c.yaml")
	os.WriteFile(yml, []byte("maxBacklogBytes: 1073741824\nmaxBacklogRows: 7\n"), 0o644)
	c, err = ParseConfig([]string{"--config", yml, "--feed", "l=file:/tmp/l.csv"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if lim, _, _ := c.Backlog.limit(dir, false); lim != (outbox.BacklogLimit{Bytes: 1 << 30, Rows: 7}) {
		t.Fatalf("from YAML: %+v", lim)
	}
}

// The API tells an unauthorized relay by the relay's own state name.
func TestRelayStateUnauthorized(t *testing.T) {
	if string(relay.StateUnauthorized) != api.RelayStateUnauthorized {
		t.Fatalf("relay says %q, the API looks for %q", relay.StateUnauthorized, api.RelayStateUnauthorized)
	}
}
