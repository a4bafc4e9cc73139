package server

import (
	"bytes"
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
			c.BatchMax != 4000 || c.BatchBytes != 16<<20 || c.BatchWait != 5*time.Millisecond || c.Relay.Mode != "exactly-once" ||
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
		{"UnknownFlag", []string{"--bogus"}, "flag provided but not defined: -bogus"},
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
	if code := Command([]string{"-h"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "-feed value") {
		t.Fatalf("-h: exit %d, usage %q", code, out.String())
	}
}
