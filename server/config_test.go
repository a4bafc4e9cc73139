package server

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfig(t *testing.T) {
	t.Run("Defaults", func(t *testing.T) {
		c, err := ParseConfig([]string{"--feed", "l=file:/tmp/l.csv"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		f := c.Feeds["l"]
		if c.DB != "./data/outboxd.db" || c.HTTP != "127.0.0.1:8080" || c.Synchronous != "full" ||
			c.BatchMax != 16000 || c.BatchBytes != 16<<20 || c.BatchWait != 5*time.Millisecond || c.Relay.Mode != "exactly-once" ||
			c.MaxMessageBytes != 1<<20 {
			t.Fatalf("defaults: %+v", c)
		}
		if f.Processor != "forward" || f.Topic != "l.out" || f.OnFailure != "dead-letter" ||
			f.OnCompletionFailure != "stop" || f.Group != "outboxd-l" {
			t.Fatalf("feed defaults: %+v", f)
		}
	})

	t.Run("FlagsOverEnvOverFile", func(t *testing.T) {
		dir := t.TempDir()
		yml := filepath.Join(dir, "c.yaml")
		os.WriteFile(yml, []byte("db: /from/file.db\nbatchMax: 10\nbatchWait: 7ms\nfeeds:\n  l:\n    source: file:/a\n    processor: ledger\n"), 0o644)
		c, err := ParseConfig([]string{"--config", yml, "--batch-max", "30"},
			env(map[string]string{"OUTBOXD_BATCH_MAX": "20", "OUTBOXD_DB": "/from/env.db", "OUTBOXD_TOPIC": "l=ledger.x"}))
		if err != nil {
			t.Fatal(err)
		}
		if c.BatchMax != 30 || c.DB != "/from/env.db" || c.BatchWait != 7*time.Millisecond {
			t.Fatalf("precedence: batchMax %d db %s batchWait %v", c.BatchMax, c.DB, c.BatchWait)
		}
		if f := c.Feeds["l"]; f.Processor != "ledger" || f.Topic != "ledger.x" || f.Source != "file:/a" {
			t.Fatalf("feed: %+v", f)
		}
		if f := (ParseConfigOrders(t)); f.Topic != "o.status" {
			t.Fatalf("orders topic %q, want o.status", f.Topic)
		}
		for _, src := range []struct {
			args []string
			env  map[string]string
			yaml string
		}{
			{args: []string{"--max-message-bytes", "5242880"}},
			{env: map[string]string{"OUTBOXD_MAX_MESSAGE_BYTES": "5242880"}},
			{yaml: "maxMessageBytes: 5242880\n"},
		} {
			args := src.args
			if src.yaml != "" {
				os.WriteFile(yml, []byte(src.yaml), 0o644)
				args = []string{"--config", yml}
			}
			c, err := ParseConfig(args, env(src.env))
			if err != nil || c.MaxMessageBytes != 5<<20 {
				t.Fatalf("max message bytes from %+v: %d (%v), want 5 MiB", src, c.MaxMessageBytes, err)
			}
		}
		if f := (ParseConfigOrders(t)); f.Topic != "o.status" {
			t.Fatalf("orders topic %q, want o.status", f.Topic)
		}
	})

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"UnknownFlag", []string{"--batch-maxx"}, "unknown flag --batch-maxx (the closest is --batch-max)"},
		{"BadKind", []string{"--feed", "x=ftp:/a"}, `unknown feed kind "ftp"`},
		{"NoSource", []string{"--processor", "x=ledger"}, "feed x: no source"},
		{"BadProcessor", []string{"--feed", "x=file:/a", "--processor", "x=nope"}, "unknown processor"},
		{"OrdersOnAFile", []string{"--feed", "x=file:/a", "--processor", "x=orders"}, "reads a Kafka feed"},
		{"BadPolicy", []string{"--feed", "x=file:/a", "--on-failure", "x=ignore"}, "want dead-letter or stop"},
		{"BadSync", []string{"--synchronous", "off"}, `"off" is not one of full, normal`},
		{"BadBatchBytes", []string{"--batch-bytes", "0"}, "--batch-bytes: 0, want at least 1"},
		{"SmallMaxMessageBytes", []string{"--max-message-bytes", "100"}, "--max-message-bytes: 100, want 4096 to 67108864"},
		{"ShortGrace", []string{"--shutdown-grace", "5s"}, "want more than a record's work deadline"},
		{"BadRelay", []string{"--relay", "maybe"}, `mode: "maybe"`},
		{"BadFeedName", []string{"--feed", "a b=file:/x"}, "a name is letters"},
		{"StrayArgument", []string{"extra"}, `unexpected argument "extra"`},
	} {
		t.Run("Err"+tc.name, func(t *testing.T) {
			_, err := ParseConfig(tc.args, env(nil))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// ParseConfigOrders parses an orders feed's settings.
func ParseConfigOrders(t *testing.T) *FeedConfig {
	t.Helper()
	c, err := ParseConfig([]string{"--feed", "o=kafka:orders.events", "--processor", "o=orders"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	return c.Feeds["o"]
}

func TestRun_BadUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Command([]string{"--batch-max", "zero"}, &out, &errOut)
	if code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	lines := strings.Split(strings.TrimRight(errOut.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "server: ") {
		t.Fatalf("stderr %q, want one line", errOut.String())
	}
	out.Reset()
	if code := Command([]string{"-h"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "-feed NAME=file:PATH") {
		t.Fatalf("-h: exit %d, usage %q", code, out.String())
	}
}

func TestParseConfig_GivenTwice(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // "" when it must parse
	}{
		{"Flags", []string{"--feed", "a=file:/x", "--feed", "a=file:/y"}, nil,
			`feed a: --feed given twice in the command line ("file:/x", then "file:/y")`},
		{"Processor", []string{"--feed", "a=file:/x", "--processor", "a=ledger", "--processor", "a=forward"}, nil,
			`feed a: --processor given twice in the command line ("ledger", then "forward")`},
		{"Env", nil, map[string]string{"OUTBOXD_FEED": "a=file:/x,a=file:/y"},
			`feed a: --feed given twice in the environment ("file:/x", then "file:/y")`},
		{"SameValueTwice", []string{"--feed", "a=file:/x", "--feed", "a=file:/x"}, nil, ""},
		{"TwoFeeds", []string{"--feed", "a=file:/x", "--feed", "b=file:/x"}, nil, ""},
		{"FlagOverEnv", []string{"--feed", "a=file:/y"}, map[string]string{"OUTBOXD_FEED": "a=file:/x"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(tc.args, env(tc.env))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.name == "FlagOverEnv" && c.Feeds["a"].Source != "file:/y" {
					t.Fatalf("source %q, want the flag's file:/y", c.Feeds["a"].Source)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
	t.Run("YAML", func(t *testing.T) {
		yml := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(yml, []byte("feeds:\n  a:\n    source: file:/x\n  a:\n    source: file:/y\n"), 0o644)
		if _, err := ParseConfig([]string{"--config", yml}, env(nil)); err == nil || !strings.Contains(err.Error(), "line 4: feeds.a: given twice (first on line 2)") {
			t.Fatalf("err = %v, want the duplicate key named", err)
		}
	})
}

func TestParseConfig_Addresses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http", "localhost"}, `--http "localhost": want HOST:PORT`},
		{[]string{"--http", "127.0.0.1:99999"}, `--http "127.0.0.1:99999": the port "99999" is not a number from 1 to 65535`},
		{[]string{"--brokers", "kafka-1"}, `--brokers "kafka-1": want HOST:PORT`},
		{[]string{"--brokers", "kafka-1:9092,kafka-2:0"}, `--brokers "kafka-2:0": the port "0"`},
		{[]string{"--brokers", ":9092"}, `--brokers ":9092": no host`},
		{[]string{"--dev-broker-addr", "nowhere"}, `--dev-broker-addr "nowhere": want HOST:PORT`},
	} {
		if _, err := ParseConfig(tc.args, env(nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to say %q", tc.args, err, tc.want)
		}
	}
	for _, ok := range [][]string{{"--http", ":0"}, {"--http", "[::1]:8080"}, {"--dev-broker-addr", "127.0.0.1:0"}} {
		if _, err := ParseConfig(ok, env(nil)); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
}

func TestParseConfig_NewDatabaseOnlyOnTheCommandLine(t *testing.T) {
	c, err := ParseConfig(nil, env(map[string]string{"OUTBOXD_NEW_DATABASE": "true"}))
	if err != nil || c.NewDatabase {
		t.Fatalf("from the environment: NewDatabase %v (%v), want false", c.NewDatabase, err)
	}
	if c, err = ParseConfig([]string{"--new-database"}, env(nil)); err != nil || !c.NewDatabase {
		t.Fatalf("from the command line: NewDatabase %v (%v), want true", c.NewDatabase, err)
	}
}

func TestUnknownEnvs(t *testing.T) {
	got := UnknownEnvs([]string{
		"OUTBOXD_BATCH_MAXX=10", "OUTBOXD_BATCH_MAX=10", "OUTBOXD_BROKER=k:9092", "OUTBOXD_NEW_DATABASE=1",
		"OUTBOXD_ADMIN_TOKEN=x", "OUTBOXD_CONFIG=c.yaml", "HOME=/root", "OUTBOXD_HTTP=:1",
	})
	want := []UnknownEnv{
		{Name: "OUTBOXD_BATCH_MAXX", Closest: "OUTBOXD_BATCH_MAX"},
		{Name: "OUTBOXD_BROKER", Closest: "OUTBOXD_BROKERS"},
		{Name: "OUTBOXD_NEW_DATABASE", CommandLineOnly: true},
	}
	if len(got) != len(want) {
		t.Fatalf("UnknownEnvs = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("UnknownEnvs[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	var buf bytes.Buffer
	warnUnknownEnv(slog.New(slog.NewTextHandler(&buf, nil)), []string{"OUTBOXD_RELAY_BATCHES=5"})
	if line := strings.TrimSpace(buf.String()); strings.Count(line, "\n") != 0 ||
		!strings.Contains(line, "level=WARN") || !strings.Contains(line, "name=OUTBOXD_RELAY_BATCHES closest=OUTBOXD_RELAY_BATCH") {
		t.Fatalf("warning %q, want one line naming the variable and the closest one", line)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "", 3}, {"", "ab", 2}, {"kitten", "sitting", 3}, {"OUTBOXD_DB", "OUTBOXD_DB", 0}, {"ab", "ba", 2}} {
		if d := editDistance(tc.a, tc.b); d != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, d, tc.d)
		}
	}
}
