package server

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// writeYAML writes a configuration file and returns its path.
func writeYAML(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParseConfig_FileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string // want follows "--config PATH: "
	}{
		{"NotANumber", "db: x.db\nbatchMax: lots\n", `line 2: batchMax: "lots": want a whole number`},
		{"NotADuration", "relay:\n  wait: 5\n", `line 2: relay.wait: "5": want a duration such as 500ms, 5s, 2m or 24h`},
		{"NotABool", "relay:\n  createTopics: maybe\n", `line 2: relay.createTopics: "maybe": want true or false`},
		{"FeedKeyField", "feeds:\n  l:\n    source: file:/a\n    keyField: first\n", `line 4: feeds.l.keyField: "first": want a whole number`},
		{"MappingForAValue", "db:\n  path: x\n", "line 2: db: want text, not a mapping"},
		{"ListForAValue", "batchMax: [1, 2]\n", "line 1: batchMax: want a whole number, not a list"},
		{"ValueForASection", "relay: fast\n", "line 1: relay: want a mapping of keys, not a single value"},
		{"ValueForFeeds", "feeds: [a, b]\n", "line 1: feeds: want a mapping of names, not a list"},
		{"NoValue", "batchMax:\n", "line 1: batchMax: no value: want a whole number"},
		{"NestedList", "brokers: [[a]]\n", "line 1: brokers: want a list of values (or one comma-separated value), not a nested list or mapping"},
		{"UnknownTopLevel", "db: x.db\nbatchMaxx: 5\n", "line 2: unknown key batchMaxx (the closest known key is batchMax)"},
		{"UnknownInSection", "relay:\n  batchs: 5\n", "line 2: unknown key relay.batchs (the closest known key is relay.batch)"},
		{"UnknownInFeed", "feeds:\n  l:\n    source: file:/a\n    procesor: ledger\n", "line 4: unknown key feeds.l.procesor (the closest known key is feeds.l.processor)"},
		{"KeyTwice", "db: a.db\nhttp: :1\ndb: b.db\n", "line 3: db: given twice (first on line 1)"},
		{"BadIndent", "db: x.db\nfeeds:\n  ledger:\n    source: file:a\n   processor: ledger\n",
			"line 5: indented by 3 spaces, which matches no key above it (indented by 0, 2, 4) (did not find expected key)"},
		{"BadIndentReportedAtLine1", "feeds:\n  ledger:\n    source: file:a\n    processor: ledger\n   topic: x\n",
			"line 5: indented by 3 spaces, which matches no key above it (indented by 0, 2, 4) (did not find expected key)"},
		{"BadIndentOutdented", "db: x.db\nrelay:\n  mode: none\n batch: 5\n",
			"line 4: indented by 1 spaces, which matches no key above it (indented by 0, 2) (did not find expected key)"},
		{"TabIndent", "db: x.db\nhttp: a\nfeeds:\n  ledger:\n\tsource: file:a\n",
			"line 5: a tab in the indentation (YAML indents with spaces) (found character that cannot start any token)"},
		{"IndentUnderAValue", "db: x.db\nrelay:\n  mode: none\n  batch: 5\n    wait: 5ms\n",
			"line 5: indented by 4 spaces, deeper than the key above it (2), which holds a value (mapping values are not allowed in this context)"},
		{"Syntax", "db: a\n  b: c\n", "line 2: indented by 2 spaces, deeper than the key above it (0), which holds a value (mapping values are not allowed in this context)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeYAML(t, tc.yaml)
			_, err := ParseConfig([]string{"--config", path}, env(nil))
			if want := "--config " + path + ": " + tc.want; err == nil || err.Error() != want {
				t.Fatalf("err = %v\nwant  %s", err, want)
			}
		})
	}
	t.Run("EveryMistake", func(t *testing.T) {
		path := writeYAML(t, "db: x.db\nbatchMaxx: 5\nrelay:\n  wait: soon\n  mode: fast\nbatchBytes: 0\nfeeds:\n  l:\n    source: file:/a\n    procesor: ledger\n")
		var out, errOut bytes.Buffer
		if code := Command([]string{"--config", path}, &out, &errOut); code != ExitConfig {
			t.Fatalf("exit code %d, want %d", code, ExitConfig)
		}
		p := "server: --config " + path + ": "
		want := p + "line 2: unknown key batchMaxx (the closest known key is batchMax)\n" +
			p + `line 4: relay.wait: "soon": want a duration such as 500ms, 5s, 2m or 24h` + "\n" +
			p + `line 5: relay.mode: "fast" is not one of exactly-once, at-least-once` + "\n" +
			p + "line 6: batchBytes: 0, want at least 1\n" +
			p + "line 10: unknown key feeds.l.procesor (the closest known key is feeds.l.processor) (see server -h)\n"
		if errOut.String() != want {
			t.Fatalf("stderr\n%s\nwant\n%s", errOut.String(), want)
		}
	})
	t.Run("ExitCode", func(t *testing.T) {
		path := writeYAML(t, "relay:\n  mod: exactly-once\n")
		var out, errOut bytes.Buffer
		if code := Command([]string{"--config", path}, &out, &errOut); code != ExitConfig {
			t.Fatalf("exit code %d, want %d", code, ExitConfig)
		}
		want := "server: --config " + path + ": line 2: unknown key relay.mod (the closest known key is relay.mode) (see server -h)\n"
		if errOut.String() != want {
			t.Fatalf("stderr %q, want %q", errOut.String(), want)
		}
	})
}

func TestParseConfig_FileValues(t *testing.T) {
	path := writeYAML(t, `db: /var/lib/outboxd/outboxd.db
brokers: [kafka-1:9092, kafka-2:9092]
batchWait: 20ms
relay:
  createTopics: false
  outboxRetention: 1h
feeds:
  orders:
    source: kafka:orders.events
    processor: orders
  ledger:
    source: file:/var/log/ledger.csv
`)
	c, err := ParseConfig([]string{"--config", path}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.DB != "/var/lib/outboxd/outboxd.db" || !reflect.DeepEqual(c.Brokers, []string{"kafka-1:9092", "kafka-2:9092"}) ||
		c.BatchWait != 20*time.Millisecond || c.Relay.CreateTopics || c.Relay.Retention != time.Hour {
		t.Fatalf("parsed %+v", c)
	}
	if o := c.Feeds["orders"]; o.Processor != "orders" || o.Topic != "orders.status" || o.Group != "outboxd-orders" {
		t.Fatalf("orders feed %+v", o)
	}
	for key, want := range map[string]string{
		"db": path + ":1", "brokers": path + ":2", "relay.createTopics": path + ":5",
		"feeds.ledger.source": path + ":12", "feeds.ledger.topic": "default", "http": "default",
	} {
		if got := c.Origin(key); got != want {
			t.Errorf("Origin(%s) = %q, want %q", key, got, want)
		}
	}
	t.Run("CommaSeparatedList", func(t *testing.T) {
		c, err := ParseConfig([]string{"--config", writeYAML(t, "brokers: a:1, b:2\n")}, env(nil))
		if err != nil || !reflect.DeepEqual(c.Brokers, []string{"a:1", "b:2"}) {
			t.Fatalf("brokers %q (%v)", c.Brokers, err)
		}
	})
	t.Run("EmptyFile", func(t *testing.T) {
		c, err := ParseConfig([]string{"--config", writeYAML(t, "# nothing yet\n")}, env(nil))
		if err != nil || c.DB != DefaultConfig().DB {
			t.Fatalf("db %q (%v)", c.DB, err)
		}
	})
}

// TestParseConfig_DeprecatedDevBrokerKeys: the dev broker's keys moved out
// of relay:, and the old ones still work, with a warning naming the new.
func TestParseConfig_DeprecatedDevBrokerKeys(t *testing.T) {
	path := writeYAML(t, "relay:\n  mode: at-least-once\n  devBrokerAddr: 127.0.0.1:9555\n  devBrokerData: ''\n")
	c, err := ParseConfig([]string{"--config", path}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.DevBroker.Addr != "127.0.0.1:9555" || c.DevBroker.Data != "" || c.Relay.Mode != "at-least-once" {
		t.Fatalf("dev broker %+v, relay mode %s", c.DevBroker, c.Relay.Mode)
	}
	want := []string{
		path + " line 3: relay.devBrokerAddr is deprecated: use devBroker.addr",
		path + " line 4: relay.devBrokerData is deprecated: use devBroker.data",
	}
	if !reflect.DeepEqual(c.Warnings(), want) {
		t.Fatalf("warnings %q, want %q", c.Warnings(), want)
	}
	if got := c.Origin("devBroker.addr"); got != path+":3" {
		t.Fatalf("Origin(devBroker.addr) = %q", got)
	}
	c, err = ParseConfig([]string{"--config", writeYAML(t, "devBroker:\n  addr: 127.0.0.1:9556\n")}, env(nil))
	if err != nil || c.DevBroker.Addr != "127.0.0.1:9556" || len(c.Warnings()) != 0 {
		t.Fatalf("devBroker.addr: %+v %q (%v)", c.DevBroker, c.Warnings(), err)
	}
}

func TestParseConfig_Origins(t *testing.T) {
	path := writeYAML(t, "batchMax: 10\nfeeds:\n  l:\n    source: file:/a\n")
	c, err := ParseConfig([]string{"--config", path, "--topic", "l=t.x", "--relay-batch", "7"},
		env(map[string]string{"OUTBOXD_BATCH_MAX": "20", "OUTBOXD_PROCESSOR": "l=ledger"}))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"batchMax": "OUTBOXD_BATCH_MAX", "feeds.l.source": path + ":4", "feeds.l.processor": "OUTBOXD_PROCESSOR",
		"feeds.l.topic": "--topic", "relay.batch": "--relay-batch", "relay.mode": "default",
	} {
		if got := c.Origin(key); got != want {
			t.Errorf("Origin(%s) = %q, want %q", key, got, want)
		}
	}
	if _, err := ParseConfig([]string{"--relay-batch", "many"}, env(nil)); err == nil ||
		!strings.Contains(err.Error(), `invalid value "many" for flag -relay-batch: "many": want a whole number`) {
		t.Fatalf("err = %v", err)
	}
}

// TestRenderConfig_RoundTrip prints configurations gathered from every
// source and reads each back with --config: the same configuration.
func TestRenderConfig_RoundTrip(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		yaml string
		args []string
		env  map[string]string
	}{
		{name: "Defaults"},
		{name: "Everything",
			yaml: "synchronous: normal\nrelay:\n  devBrokerData: ''\nfeeds:\n  o:\n    source: kafka:orders.events\n    processor: orders\n",
			args: []string{"--feed", "l=file:/var/log/a b.csv", "--processor", "l=ledger", "--key-field", "l=2",
				"--on-completion-failure", "l=skip", "--brokers", "k1:9092,k2:9093", "--relay", "at-least-once",
				"--transactional-id", "true", "--create-topics=false", "--admin-token-file", tokenFile, "--new-database"},
			env: map[string]string{"OUTBOXD_BATCH_WAIT": "250us", "OUTBOXD_TOPIC": "l=010", "OUTBOXD_OUTBOX_RETENTION": "0s",
				"OUTBOXD_LOG_LEVEL": "debug"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, file := tc.args, ""
			if tc.yaml != "" {
				file = writeYAML(t, tc.yaml)
				args = append([]string{"--config", file}, args...)
			}
			c, err := ParseConfig(args, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			out, err := RenderConfig(c, false)
			if err != nil {
				t.Fatal(err)
			}
			path := writeYAML(t, string(out))
			back, err := ParseConfig([]string{"--config", path}, env(nil))
			if err != nil {
				t.Fatalf("reading back:\n%s\n%v", out, err)
			}
			c.NewDatabase = false // command line only, named in the header
			c.origins, back.origins, c.warnings = nil, nil, nil
			if !reflect.DeepEqual(c, back) {
				t.Fatalf("read back\n%+v\nwant\n%+v\nfrom:\n%s", back, c, out)
			}
			if tc.name != "Everything" {
				return
			}
			for _, line := range []string{
				"synchronous: normal # from " + file + ":1",
				"batchWait: 250µs # from OUTBOXD_BATCH_WAIT",
				"brokers: ['k1:9092', 'k2:9093'] # from --brokers",
				`    topic: "010" # from OUTBOXD_TOPIC`,
				`  transactionalId: "true" # from --transactional-id`,
				"    group: outboxd-l # default",
				"  data: \"\" # from " + file + ":3",
				"# --new-database was given: only the command line sets it, so it is not kept here.",
			} {
				if !strings.Contains(string(out), line+"\n") {
					t.Errorf("no line %q in:\n%s", line, out)
				}
			}
		})
	}
	t.Run("Command", func(t *testing.T) {
		t.Setenv("OUTBOXD_RELAY_BATCH", "12")
		var out, errOut bytes.Buffer
		if code := Command([]string{"config", "--feed", "l=file:/a"}, &out, &errOut); code != ExitOK {
			t.Fatalf("exit code %d: %s", code, errOut.String())
		}
		c, err := ParseConfig([]string{"--config", writeYAML(t, out.String())}, env(nil))
		if err != nil || c.Relay.Batch != 12 || c.Feeds["l"].Source != "file:/a" {
			t.Fatalf("read back relay batch %d, feeds %v (%v) from:\n%s", c.Relay.Batch, c.Feeds, err, out.String())
		}
		errOut.Reset()
		if code := Command([]string{"config", "--batch-max", "0"}, &out, &errOut); code != ExitConfig ||
			errOut.String() != "server: --batch-max: 0, want at least 1 (see server -h)\n" {
			t.Fatalf("exit code %d, stderr %q", code, errOut.String())
		}
	})
}

// TestRenderConfig_Secrets leaves secret values out and names them.
func TestRenderConfig_Secrets(t *testing.T) {
	type withSecret struct {
		User     string `yaml:"user"`
		Password string `yaml:"password"`
	}
	r := &renderer{c: &Config{origins: map[string]string{"sasl.password": "OUTBOXD_SASL_PASSWORD"}}}
	n := r.mapping(reflect.ValueOf(withSecret{User: "u", Password: "hunter2"}), "sasl")
	if len(n.Content) != 2 || n.Content[0].Value != "user" || !reflect.DeepEqual(r.secrets, []string{"sasl.password"}) {
		t.Fatalf("rendered %d nodes, secrets %q", len(n.Content), r.secrets)
	}
}

// TestRenderConfig_Passwords prints a URL's or a DSN's password as
// REDACTED and names the key in the header; other URLs are unchanged.
func TestRenderConfig_Passwords(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:s3cr%40t@db:5432/out?sslmode=require": "postgres://app:REDACTED@db:5432/out?sslmode=require",
		"postgres://db/out?password=x&user=app":               "postgres://db/out?password=REDACTED&user=app",
		"host=db user=app password='a b' dbname=out":          "host=db user=app password=REDACTED dbname=out",
		"nats://user:pw@127.0.0.1:4222":                       "nats://user:REDACTED@127.0.0.1:4222",
		"postgres://app@db/out":                               "postgres://app@db/out",
		"https://hooks.example.com/in":                        "https://hooks.example.com/in",
		"/var/lib/outboxd/outboxd.db":                         "/var/lib/outboxd/outboxd.db",
	} {
		got, changed := redactPassword(in)
		if got != want || changed != (in != want) {
			t.Errorf("redactPassword(%q) = %q, %v; want %q", in, got, changed, want)
		}
	}
	c, err := ParseConfig([]string{"--db", "postgres://app:hunter2@127.0.0.1/out"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	out, err := RenderConfig(c, false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "hunter2") ||
		!strings.Contains(string(out), "db: postgres://app:REDACTED@127.0.0.1/out # from --db\n") ||
		!strings.Contains(string(out), "# db holds a password (--db), printed as REDACTED: put it back, or keep it in a password file.\n") {
		t.Fatalf("rendered:\n%s", out)
	}
}
