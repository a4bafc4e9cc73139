package server

import (
	"strings"
	"testing"
)

// TestParseConfig_KafkaGroup: --kafka-group is for a Kafka feed on a
// PostgreSQL database, and makes the server share it.
func TestParseConfig_KafkaGroup(t *testing.T) {
	const pg = "postgres://outboxd@127.0.0.1/outboxd"
	c, err := ParseConfig([]string{"--db", pg, "--feed", "o=kafka:orders", "--kafka-group", "o=outboxd-orders",
		"--server-id", "s1"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Feeds["o"].KafkaGroup != "outboxd-orders" || !c.Shared() || c.ServerID != "s1" || c.RelayLease.String() != "5s" {
		t.Fatalf("config %+v, %+v: want feed o in group outboxd-orders, shared, server s1, lease 5s", c, c.Feeds["o"])
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--db", pg, "--feed", "o=file:/tmp/o.csv", "--kafka-group", "o=g"},
			"--kafka-group o=g: only a Kafka feed (--feed o=kafka:TOPIC) joins a consumer group"},
		{[]string{"--db", "/tmp/o.db", "--feed", "o=kafka:orders", "--kafka-group", "o=g"},
			"--kafka-group o=g: servers share a feed only on a PostgreSQL --db (postgres://...)"},
		{[]string{"--db", pg, "--feed", "o=kafka:orders", "--relay-lease", "10ms"},
			"--relay-lease: 10ms, want at least 1s"},
	} {
		_, err := ParseConfig(tc.args, env(nil))
		if err == nil || strings.TrimSpace(err.Error()) != tc.want {
			t.Errorf("ParseConfig(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}
